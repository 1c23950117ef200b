"""Device arrays and memory: DeviceArray, the importer of foreign arrays, pools, transfers, staging, pinned buffers."""
