"""Data types, byte sizes, input checks and memory formatting shared by the whole model.

Bytes per element follow the storage width of each format (IEEE 754 binary32/binary16,
bfloat16, the OCP 8-bit float spec for fp8 e4m3/e5m2, and two 4-bit values packed per byte for
int4). TF32 is a compute mode of the tensor cores: its values are stored as 32-bit floats, so
it costs 4 bytes per element in memory (NVIDIA A100 whitepaper, "TensorFloat-32").
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from fractions import Fraction
from numbers import Integral, Real

#: Bytes per stored element, by dtype name. Fractions keep int4's half byte exact.
DTYPE_BYTES: dict[str, Fraction] = {
    "fp32": Fraction(4),
    "tf32": Fraction(4),
    "bf16": Fraction(2),
    "fp16": Fraction(2),
    "fp8_e4m3": Fraction(1),
    "fp8_e5m2": Fraction(1),
    "int8": Fraction(1),
    "int4": Fraction(1, 2),
}

#: Torch spellings (and a few common aliases) accepted for the names above.
DTYPE_ALIASES: dict[str, str] = {
    "float32": "fp32",
    "float": "fp32",
    "torch.float32": "fp32",
    "bfloat16": "bf16",
    "torch.bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "torch.float16": "fp16",
    "float8_e4m3fn": "fp8_e4m3",
    "float8_e5m2": "fp8_e5m2",
    "fp8": "fp8_e4m3",
}

DTYPES: tuple[str, ...] = tuple(DTYPE_BYTES)

#: Largest sizes accepted anywhere: far beyond any real model, small enough to catch typos.
MAX_SEQ_LEN = 100_000_000
MAX_BATCH = 1_000_000
MAX_HEADS = 100_000
MAX_HEAD_DIM = 65_536

GB = 10**9
GIB = 2**30


def dtype_name(dtype: str) -> str:
    """Canonical dtype name (`fp16`, `bf16`, ...) for a name or torch spelling.

    Raises ValueError naming the accepted names for anything else.
    """
    if not isinstance(dtype, str):
        raise TypeError(f"dtype must be a name such as 'fp16', got {dtype!r}")
    key = dtype.strip().lower()
    key = DTYPE_ALIASES.get(key, key)
    if key not in DTYPE_BYTES:
        accepted = ", ".join(DTYPES) + " (or float32, bfloat16, float16)"
        raise ValueError(f"unknown dtype {dtype!r}; accepted: {accepted}")
    return key


def dtype_bytes(dtype: str) -> Fraction:
    """Bytes per element of a dtype name, exact (int4 is Fraction(1, 2))."""
    return DTYPE_BYTES[dtype_name(dtype)]


def check_int(name: str, value: object, lo: int = 1, hi: int | None = None) -> int:
    """Return `value` as an int if it is a whole number in [lo, hi]; else raise ValueError.

    Bools and non-integral floats are refused (a 2.5-head model is a typo, not a model);
    integral floats such as 4096.0 are accepted, since sliders and JSON produce them.
    """
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    if isinstance(value, Integral):
        as_int = int(value)
    else:
        f = float(value)
        if not math.isfinite(f) or f != int(f):
            raise ValueError(f"{name} must be a whole number, got {value!r}")
        as_int = int(f)
    if as_int < lo or (hi is not None and as_int > hi):
        upper = f"{hi:,}" if hi is not None else "any size"
        raise ValueError(f"{name} must be a whole number from {lo:,} to {upper}, got {value!r}")
    return as_int


def check_bool(name: str, value: object) -> bool:
    """Return value if it is exactly True or False (not 'false', 0 or None); else ValueError."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def check_bytes_per_element(value: object) -> Fraction:
    """Bytes per element as an exact Fraction; accepts numbers in (0, 64] or a dtype name."""
    if isinstance(value, str):
        return dtype_bytes(value)
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"bytes_per_element must be a number such as 2 or 0.5, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"bytes_per_element must be a finite number, got {value!r}")
    # A float is read as the decimal the user typed (0.3 -> 3/10), not rounded to a nearby
    # fraction; the final byte count is rounded up once, in ceil_bytes.
    frac = Fraction(repr(float(value))) if isinstance(value, float) else Fraction(value)
    if not 0 < frac <= 64:
        raise ValueError(f"bytes_per_element must be above 0 and at most 64, got {value!r}")
    return frac


def ceil_bytes(x: Fraction | int) -> int:
    """Whole bytes needed to hold an exact byte count (half bytes round up)."""
    return math.ceil(x)


def _check_real(n_bytes: object) -> Real:
    """Return n_bytes if it is a real number (negative allowed: a headroom can be < 0)."""
    if isinstance(n_bytes, bool) or not isinstance(n_bytes, Real):
        raise ValueError(f"n_bytes must be a number of bytes, got {n_bytes!r:.80}")
    return n_bytes


def _scaled(n_bytes: object, divisor: int) -> Decimal | float:
    """n_bytes / divisor, exact for integers of any size (Decimal), as float for floats.

    Non-finite floats stay non-finite ('nan', 'inf'), which prints as such: never a
    plausible-looking number.
    """
    n = _check_real(n_bytes)
    if isinstance(n, float):
        return n / divisor
    if isinstance(n, Integral):
        with localcontext() as ctx:
            ctx.prec = max(28, len(str(abs(int(n)))) + 10)
            return Decimal(int(n)) / Decimal(divisor)
    return float(n) / divisor  # Fraction and other reals


def format_gb(n_bytes: int | float, digits: int = 2) -> str:
    """Decimal gigabytes (10^9 bytes): 1,073,741,824 -> '1.07 GB'."""
    return f"{_scaled(n_bytes, GB):,.{digits}f} GB"


def format_gib(n_bytes: int | float, digits: int = 2) -> str:
    """Binary gibibytes (2^30 bytes): 1,073,741,824 -> '1.00 GiB'."""
    return f"{_scaled(n_bytes, GIB):,.{digits}f} GiB"


def format_bytes(n_bytes: int | float, unit: str = "GB", digits: int = 2) -> str:
    """Format a byte count in 'GB' (10^9) or 'GiB' (2^30), chosen by the user's unit switch.

    Small values switch to MB/MiB and KB/KiB so that a linear FlashAttention footprint does not
    print as '0.00 GB'.
    """
    if unit not in ("GB", "GiB"):
        raise ValueError(f"unit must be 'GB' or 'GiB', got {unit!r}")
    base = 1000 if unit == "GB" else 1024
    names = ["B", "KB", "MB", "GB"] if unit == "GB" else ["B", "KiB", "MiB", "GiB"]
    n = _check_real(n_bytes)
    if isinstance(n, float) and not math.isfinite(n):
        return f"{n} B"
    idx = 0
    while abs(n) >= base ** (idx + 1) and idx < 3:  # stop at GB/GiB: "1,234.56 GB", never TB
        idx += 1
    if idx == 0:
        return f"{_scaled(n, 1):,.0f} B"
    return f"{_scaled(n, base**idx):,.{digits}f} {names[idx]}"


def to_unit(n_bytes: int | float, unit: str = "GB") -> float:
    """Bytes as a float in GB (10^9) or GiB (2^30), for chart axes."""
    n = _check_real(n_bytes)
    if isinstance(n, Integral) and abs(int(n)) >= 2**1000:
        raise ValueError(f"n_bytes is too large to plot ({len(str(abs(int(n))))} digits)")
    divisor = GB if unit == "GB" else GIB
    if unit in ("GB", "GiB"):
        return float(_scaled(n, divisor))
    if unit == "GB":
        return n_bytes / GB
    if unit == "GiB":
        return n_bytes / GIB
    raise ValueError(f"unit must be 'GB' or 'GiB', got {unit!r}")


def short_len(n: int) -> str:
    """A sequence length as the sliders label it: 128 -> '128', 4096 -> '4K', 1048576 -> '1M'
    (binary K/M, as sequence lengths go; other values with thousands separators)."""
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20}M"
    if n >= 1 << 10 and n % (1 << 10) == 0:
        return f"{n >> 10}K"
    return f"{n:,}"
