"""Kernel-development probes: one-off command lines (``python -m attnmem.kernels.dev.NAME``) that
compile, time, A/B or profile the bundled kernels on a GPU. Their findings are in
attnmem/kernels/flash/NOTES.md; nothing in the product imports them."""
