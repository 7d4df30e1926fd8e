"""The bundled FlashAttention: the public call and autograd (``api``), the portable Triton
forward (``fwd``), the Hopper Gluon forward (``fwd_sm90``), the backward (``bwd``), the JIT
launcher (``launcher``) and the eager oracle (``reference``). Importing this package is light;
``kernels.flash.api`` pulls in triton."""
