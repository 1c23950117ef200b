"""The CUDA runtime underneath: devices and primary contexts, streams, launches, recording, errors."""
