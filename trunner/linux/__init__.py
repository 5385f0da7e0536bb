"""The Linux jail backend, split by process: parent side and helper side."""
