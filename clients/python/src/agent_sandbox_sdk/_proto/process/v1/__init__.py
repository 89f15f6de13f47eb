"""Generated protobuf messages of sandboxd's process.v1 API (copied from the runtime's generated module; see _process.py)."""
