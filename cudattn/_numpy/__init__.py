"""The NumPy path of each operation: copy in through pinned staging, run on the device, copy back."""
