"""Tools around the library: the command line, the C export, the kernel-cache warm-up."""
