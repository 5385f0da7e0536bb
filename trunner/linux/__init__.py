"""The Linux jail backend, the parent side (the child side: `trunner.helper`,
`trunner.kernel`, `trunner.worker`)."""
