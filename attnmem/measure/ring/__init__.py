"""Ring attention measured: one rank simulated on one device (``simulate``, ``one_rank``) and a
real ring over several GPUs (``multi``, under torchrun)."""
