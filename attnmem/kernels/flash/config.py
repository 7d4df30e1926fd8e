"""What the caller may choose about a kernel call (`KernelConfig`), and the process-wide
defaults of the kernel's own rules (`SETTINGS`).

No environment variable changes what the kernel runs: a caller chooses per call with
`KernelConfig`. `SETTINGS` holds the defaults those rules fall back to; only tests and the
bench tools set its attributes (e.g. `retune` for a tuning run).

Every field of `KernelConfig` is optional: None means "the kernel's own rule decides" (the
stored H200 tiles or the autotuner, the dispatch rules of ``attnmem.calc.dispatch``, the Hopper
forward's default schedule). A field that is set forces its choice, and a forced choice that
cannot run here raises instead of running something else. The configuration is checked once,
when it is built; a ValueError names the field, the value and what is accepted.

Nothing here imports triton or torch: the launcher and the tests read `SETTINGS` without
compiling anything.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

TILE_SIZES = (16, 32, 64, 128, 256)  # BLOCK_M / BLOCK_N values the kernels compile for
WARPS = (1, 2, 4, 8, 16)
SM90_CONSUMERS = (2, 3)  # consumer warpgroups of the Hopper forward (3 only at d = 64)


@dataclass
class Settings:
    """Process-wide defaults of the kernel's rules. Never read from the environment; tests and
    bench tools patch the attributes of `SETTINGS`, callers use `KernelConfig`."""

    retune: bool = False  # True: tune every key instead of using the stored H200 tiles
    descriptors: bool = True  # False: the Triton forward loads K/V by pointer
    sm90: bool = True  # False: the Hopper Gluon kernels are never the default
    direct_launch: bool = True  # False: every launch takes the JIT path
    # True: the Hopper Gluon backward runs where `route.backward_route` allows it (the GPU
    # suite passes through that route: attnmem/kernels/flash/NOTES.md, "the route on by default");
    # KernelConfig(sm90_bwd=...) decides per call.
    sm90_bwd: bool = True
    # True: the Hopper Gluon forward also takes d = 80 and 96, in 128-wide tiles
    # (`fwd_sm90.PADDED_HEAD_DIMS`). Off until that form has run on a GPU
    # (attnmem/kernels/flash/NOTES.md, "Head dims 80 and 96 on the Hopper forward"): the GPU
    # tests and the bench's "triton_sm90" turn it on.
    sm90_padded_dims: bool = False


SETTINGS = Settings()


def _check_int(name: str, value, allowed=None, positive: bool = False) -> None:
    """ValueError unless value is None or an int (not a bool) that is in ``allowed`` (when
    given) and >= 1 (when ``positive``), saying what is accepted."""
    if value is None:
        return
    if allowed is not None:
        accepted = f"one of {', '.join(map(str, allowed))} or None"
    else:
        accepted = "a positive int or None" if positive else "an int or None"
    if (isinstance(value, bool) or not isinstance(value, int)
            or (allowed is not None and value not in allowed) or (positive and value < 1)):
        raise ValueError(f"{name} must be {accepted}, got {value!r}")


def _check_bool(name: str, value) -> None:
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{name} must be True, False or None, got {value!r}")


@dataclass(frozen=True)
class Tiles:
    """One Triton launch's tile shape and schedule."""

    block_m: int  # query rows per program (the dK/dV kernel: rows per step of its query loop)
    block_n: int  # keys per step (the dK/dV kernel: keys per program)
    num_warps: int  # warps per program
    num_stages: int  # software-pipeline depth of the tile loads

    def __post_init__(self) -> None:
        _check_int("block_m", self.block_m, TILE_SIZES)
        _check_int("block_n", self.block_n, TILE_SIZES)
        _check_int("num_warps", self.num_warps, WARPS)
        _check_int("num_stages", self.num_stages, positive=True)
        for f in fields(self):
            if getattr(self, f.name) is None:
                raise ValueError(f"Tiles.{f.name} must be given, got None")

    def meta(self) -> dict:
        """The launch's keyword arguments: the kernel's tile constexprs and its options."""
        return {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n,
                "num_warps": self.num_warps, "num_stages": self.num_stages}

    @classmethod
    def of(cls, value) -> Tiles | None:
        """Tiles from Tiles, a (BLOCK_M, BLOCK_N, num_warps, num_stages) tuple, or None."""
        if value is None or isinstance(value, Tiles):
            return value
        if isinstance(value, tuple) and len(value) == 4:
            return cls(*value)
        raise ValueError("tiles must be Tiles, a (BLOCK_M, BLOCK_N, num_warps, num_stages) "
                         f"tuple, or None; got {value!r}")


@dataclass(frozen=True)
class KernelConfig:
    """A call's choices; None everywhere is the default call (`KernelConfig()`)."""

    # The Triton kernels' tiles: the portable forward's, and both backward launches' unless
    # dq_tiles / dkdv_tiles say otherwise. None: the stored H200 choice or the autotuner.
    tiles: Tiles | None = None
    # The portable forward loads its unmasked K/V tiles through tensor descriptors (TMA):
    # True forces it (ValueError where the layout or Triton cannot), False keeps pointer
    # loads, None lets `route.forward_route` decide (Hopper, 16-bit, keys from the length
    # bucket `route.DESC_MIN_BUCKET` up).
    use_desc: bool | None = None
    # The Hopper Gluon forward (fwd_sm90): True runs it (ValueError where it cannot run),
    # False runs the portable Triton forward, None the default rule (`route.forward_route`).
    sm90: bool | None = None
    # Hopper forward: K/V ring slots (None: its table `fwd_sm90.TILES`, or the default schedule).
    sm90_stages: int | None = None
    # Hopper forward: keys per block (None: `fwd_sm90.TILES`).
    sm90_block_n: int | None = None
    # Hopper forward: consumer warpgroups of 64 query rows, 2 or 3 (3 at d = 64 only).
    sm90_consumers: int | None = None
    # The backward adds dQ with atomics into an fp32 buffer (True) or runs the deterministic
    # two-kernel backward (False); None: `route.atomic_by_default`.
    atomic_dq: bool | None = None
    # Atomic dQ on Hopper: False keeps element-wise atomic adds where the copy engine's bulk
    # reduce-add would run; None (or True): bulk adds where `route.dq_tma_usable`.
    dq_tma: bool | None = None
    # dK/dV programs per GQA group (a divisor of H / H_kv, checked at the call); None:
    # `route.kv_split`.
    kv_split: int | None = None
    # The two-kernel backward's dQ launch tiles (None: `tiles`, else stored/autotuned).
    dq_tiles: Tiles | None = None
    # The dK/dV launch's tiles, also the atomic-dQ backward's (None: `tiles`, else
    # `bwd.atomic_tiles` for the atomic backward and stored/autotuned for the two-kernel one).
    dkdv_tiles: Tiles | None = None
    # The Hopper Gluon backward (bwd_sm90): True runs it (ValueError where it cannot), False
    # keeps the Triton backward, None the default rule (`route.backward_route`: unless
    # SETTINGS.sm90_bwd is off, in attnmem.calc.dispatch's Hopper region, where the rules give atomic dQ
    # and no GQA split, and only when no field above picks something of the Triton backward).
    sm90_bwd: bool | None = None

    def triton_backward_chosen(self) -> bool:
        """Whether a field picks something of the Triton backward (tiles, the atomic-dQ
        choice, element-wise adds, the GQA split)."""
        return any(getattr(self, n) is not None for n in _TRITON_BWD_FIELDS)

    def __post_init__(self) -> None:
        for name in ("tiles", "dq_tiles", "dkdv_tiles"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Tiles):
                object.__setattr__(self, name, _named(name, Tiles.of, value))
        for name in ("use_desc", "sm90", "atomic_dq", "dq_tma", "sm90_bwd"):
            _check_bool(name, getattr(self, name))
        _check_int("sm90_stages", self.sm90_stages, positive=True)
        _check_int("sm90_block_n", self.sm90_block_n, (64, 128))
        _check_int("sm90_consumers", self.sm90_consumers, SM90_CONSUMERS)
        _check_int("kv_split", self.kv_split, positive=True)
        if self.sm90 is not True and any(getattr(self, n) is not None for n in _SM90_FIELDS):
            raise ValueError(f"{', '.join(n for n in _SM90_FIELDS if getattr(self, n) is not None)}"
                             f" apply to the Hopper forward only: set sm90=True, got "
                             f"sm90={self.sm90!r}")

    @classmethod
    def of(cls, value) -> KernelConfig | None:
        """``value`` itself when it is a KernelConfig or None; ValueError otherwise."""
        if value is None or isinstance(value, KernelConfig):
            return value
        raise ValueError(f"config must be a KernelConfig or None, got {value!r}")


_SM90_FIELDS = ("sm90_stages", "sm90_block_n", "sm90_consumers")
_TRITON_BWD_FIELDS = ("tiles", "dq_tiles", "dkdv_tiles", "atomic_dq", "dq_tma", "kv_split")


def _named(name: str, fn, *args):
    """fn(*args), with a ValueError's message prefixed by the field's name."""
    try:
        return fn(*args)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
