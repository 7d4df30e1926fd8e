"""The bundled FlashAttention: the public call and autograd (``api``), the portable Triton
forward (``fwd``), the Hopper Gluon forward (``fwd_sm90``), the backward (``bwd``), what they
share (``common``: tile helpers, the launch path, the one allocation helper), the call's
choices and the process settings (``config``), the stored tiles (``tuned``), the JIT launcher
(``launcher``) and the eager oracle (``reference``). Importing this package is light;
``kernels.flash.api`` pulls in triton."""
