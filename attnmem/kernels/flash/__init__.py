"""The bundled FlashAttention: the public call and autograd (``api``), which kernel runs a call
(``route``: forward and backward, one place), the portable Triton forward (``fwd``) and backward
(``bwd``), the Hopper Gluon forward (``fwd_sm90``) and backward (``bwd_sm90``), what they share
(``common``: tile helpers, the launch path, the one allocation helper), the call's choices and
the process settings (``config``), the stored tiles (``tuned``), the JIT launcher
(``launcher``) and the eager oracle (``reference``). Importing this package is light;
``attnmem.kernels.flash.api`` pulls in triton."""
