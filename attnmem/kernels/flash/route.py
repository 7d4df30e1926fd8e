"""Which kernel runs a `flash_attention` call, forward and backward: the one place that decides.

`api.flash_attention` checks its inputs and calls `attention_forward` (and, through autograd,
`attention_backward`) here. Each asks a pure decision function which kernel runs, with which
settings, and calls that kernel:

    forward:   `forward_route`  -> fwd_sm90.attention_forward_sm90   (Hopper, Gluon)
                                 -> fwd_sm90.attention_forward_sm90_packed (Hopper, packed)
                                 -> fwd.triton_forward / fwd.packed_forward
    backward:  `backward_route` -> bwd_sm90.attention_backward_sm90  (Hopper, Gluon)
                                 -> bwd_sm90.attention_backward_sm90_packed (Hopper, packed)
                                 -> bwd.triton_backward / bwd.packed_backward

The decisions read the call's shape (`Call`), its `KernelConfig`, `config.SETTINGS` and what
the device can run for these tensors (`Abilities`; at a real call `probe` finds it out, only as
far as a decision needs it). The rules that decide the backward's buffers (atomic dQ, the GQA
split, the Hopper region) are attnmem.calc.dispatch's, the one copy attnmem.calc.peak reads too, so the memory
model predicts the buffers of whichever kernel runs. A config field that forces a choice the
inputs cannot take raises ValueError naming the field and why, instead of running something
else.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from types import ModuleType
from typing import NamedTuple

import torch

from attnmem.calc import dispatch
from attnmem.kernels.flash import bwd, fwd
from attnmem.kernels.flash.common import LOG2E, Packed, TensorDescriptor, block_d, seq_bucket
from attnmem.kernels.flash.config import SETTINGS, KernelConfig

__all__ = ["SM90_IMPORT_ERRORS", "Abilities", "BackwardRoute", "Call", "ForwardRoute",
           "atomic_by_default", "attention_backward", "attention_forward", "backward_route",
           "check_window", "descriptors_usable", "dq_tma_usable", "forward_route",
           "gluon_missing", "kv_split", "probe", "split_for"]

log = logging.getLogger(__name__)

# ---- the Hopper Gluon kernels ------------------------------------------------------------------

#: Why a Hopper Gluon module did not import, by module name ("attnmem.kernels.flash.fwd_sm90",
#: "attnmem.kernels.flash.bwd_sm90"): "<exception type>: <message>". Empty where both imported,
#: and where this Triton has no Gluon at all (`gluon_missing`: the kernels are then simply not
#: available). Anything recorded here is a failure of our module or of a Gluon API it uses:
#: it is logged once, the route then runs the portable kernels, and the tests fail on it.
SM90_IMPORT_ERRORS: dict[str, str] = {}


def gluon_missing() -> bool:
    """Whether this Triton has no Gluon (triton.experimental.gluon cannot be found): the one
    case where the Hopper kernels are quietly not available."""
    try:
        return importlib.util.find_spec("triton.experimental.gluon") is None
    except ModuleNotFoundError:  # no triton.experimental either
        return True


def _import_sm90(name: str) -> ModuleType | None:
    """The Hopper module ``name`` (dotted), or None where it cannot be imported. A Triton
    without Gluon is quiet; any other failure is recorded in `SM90_IMPORT_ERRORS` and logged
    as a warning naming the module and the exception."""
    try:
        return importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - recorded and logged, not swallowed
        if isinstance(exc, ImportError) and gluon_missing():
            return None
        SM90_IMPORT_ERRORS[name] = f"{type(exc).__name__}: {exc}"
        log.warning("%s failed to import, so the Hopper kernels it holds are off and the "
                    "portable Triton kernels run instead: %s", name, SM90_IMPORT_ERRORS[name],
                    exc_info=exc)
        return None


fwd_sm90 = _import_sm90("attnmem.kernels.flash.fwd_sm90")
bwd_sm90 = _import_sm90("attnmem.kernels.flash.bwd_sm90")


def _import_error(module: ModuleType | None, name: str) -> str:
    """'' or, where ``name`` failed to import, "; <name> failed to import: <reason>" (for the
    messages of a forced Hopper kernel that cannot run)."""
    reason = SM90_IMPORT_ERRORS.get(name) if module is None else None
    return f"; {name} failed to import: {reason}" if reason else ""

# The Triton forward loads K/V through tensor descriptors (Hopper, 16-bit) for keys whose
# length bucket (`common.seq_bucket`: s_k rounded up to a power of two) is at least this, so
# from s_k = 1,025 on; the stored tiles of these buckets were tuned with descriptors. Below,
# pointer loads: encoding two tensor maps per launch costs more host time than the copy
# engine saves on short keys (attnmem/kernels/flash/NOTES.md, "accumulate inside tl.dot,
# tensor descriptors"). The one statement of this threshold: docstrings name it.
DESC_MIN_BUCKET = 2048
# Grid dimension 1 (y) holds at most this many programs (CUDA's limit on gridDim.y): the
# Hopper forward's packed grid puts sequences x heads there.
GRID_Y_MAX = dispatch.GRID_Y_MAX

kv_split = dispatch.kv_split


class Call(NamedTuple):
    """What the route reads of a call: q (B, H, s_q, d), k and v (B, H_kv, s_k, d), bytes per
    element, the causal flag, the window that applies (None, or 1 <= window < s_q: see
    `check_window`), whether the sequences are packed (``cu_seqlens``), q's dtype and
    device (read only by the messages), and for packed calls the number of sequences and the
    longest query and key sequence (0 otherwise)."""

    B: int
    H: int
    H_kv: int
    s_q: int
    s_k: int
    d: int
    elem: int
    causal: bool
    window: int | None = None
    packed: bool = False
    dtype: object = ""
    device: object = ""
    n_seq: int = 0
    max_q: int = 0
    max_k: int = 0

    @classmethod
    def of(cls, q: torch.Tensor, k: torch.Tensor, causal: bool, window: int | None,
           packed: Packed | None = None) -> Call:
        B, H, s_q, d = q.shape
        ks = k.shape
        n_seq, max_q, max_k = ((0, 0, 0) if packed is None
                               else (packed.n_seq, packed.max_q, packed.max_k))
        # tuple.__new__ directly: the generated __new__ costs as much again, on every call
        return tuple.__new__(cls, (B, H, ks[1], s_q, ks[2], d, q.element_size(), bool(causal),
                                   window, packed is not None, q.dtype, q.device, n_seq, max_q,
                                   max_k))


class Abilities(NamedTuple):
    """What the device can run for a call's tensors (`probe` finds it out at a real call; a
    test states it). Every field False is a CPU or a GPU without the Hopper kernels."""

    sm90_fwd: bool = False  # the Gluon forward takes q, k, v (`fwd_sm90.usable`)
    sm90_bwd: bool = False  # the Gluon backward takes q, k, v, dO, O (`bwd_sm90.usable`)
    hopper: bool = False  # a CUDA device of compute capability 9 or newer (the copy engine)
    desc_layout: bool = False  # K and V can be read as (rows, d) tensor descriptors
    dq_tma: bool = False  # the fp32 dQ buffer can take the copy engine's bulk adds
    deterministic: bool = False  # torch.use_deterministic_algorithms(True) is in force
    # the Gluon backward's packed form takes q, k, v, dO, O (`bwd_sm90.usable_packed`: any total)
    sm90_bwd_packed: bool = False


class _Probe:
    """`Abilities` of real tensors, each looked up when a decision reads it (a routed call pays
    only for the checks its route needs; each decision reads a field at most once)."""

    __slots__ = ("q", "k", "v", "do", "o")

    def __init__(self, q, k, v, do=None, o=None):
        self.q, self.k, self.v, self.do, self.o = q, k, v, do, o

    @property
    def sm90_fwd(self) -> bool:
        return fwd_sm90 is not None and fwd_sm90.usable(self.q, self.k, self.v)

    @property
    def sm90_bwd(self) -> bool:
        return bwd_sm90 is not None and bwd_sm90.usable(self.q, self.k, self.v, self.do, self.o)

    @property
    def sm90_bwd_packed(self) -> bool:
        return (bwd_sm90 is not None
                and bwd_sm90.usable_packed(self.q, self.k, self.v, self.do, self.o))

    @property
    def hopper(self) -> bool:
        return (self.k.device.type == "cuda"
                and torch.cuda.get_device_capability(self.k.device)[0] >= 9)

    @property
    def desc_layout(self) -> bool:
        return _desc_layout(self.k, self.v, self.q.shape[3])

    @property
    def dq_tma(self) -> bool:
        d = self.q.shape[3]
        return (TensorDescriptor is not None and self.q.device.type == "cuda"
                and block_d(d) == d and torch.cuda.get_device_capability(self.q.device)[0] >= 9)

    @property
    def deterministic(self) -> bool:
        return torch.are_deterministic_algorithms_enabled()


def _desc_layout(k: torch.Tensor, v: torch.Tensor, d: int) -> bool:
    """Whether K and V (head dim d) can be read as (rows, d) tensor descriptors: a Triton with
    them, d a power of two of at least 16 bytes, and (batch, head, seq) flattening into rows
    (`fwd.rows_view`)."""
    return (TensorDescriptor is not None and d == block_d(d) and d * k.element_size() >= 16
            and fwd.rows_view(k) is not None and fwd.rows_view(v) is not None)


def probe(q, k, v, do=None, o=None) -> Abilities:
    """What the device can run for these tensors (dO and O: the backward's), read lazily."""
    return _Probe(q, k, v, do, o)  # type: ignore[return-value]


# ---- the window -------------------------------------------------------------------------------

def check_window(window, causal: bool, s_q: int) -> int | None:
    """The window to run: None (no window) or an int from 1 to s_q - 1.

    A window must be a positive int (not a bool) and needs causal=True; a window of s_q keys
    or more hides no key from any query (query i sees at most i + 1 <= s_q keys), so it is
    dropped and the call takes the unwindowed path exactly."""
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive int (keys each query sees, itself "
                         f"included) or None, got {window!r}")
    if not causal:
        raise ValueError(f"window={window} was given with causal=False; the sliding window is "
                         "causal only (query i sees keys i - window + 1 .. i): pass "
                         "causal=True, or window=None for full attention")
    return None if window >= s_q else int(window)


# ---- the forward --------------------------------------------------------------------------------

class ForwardRoute(NamedTuple):
    """The forward that runs: kernel "sm90" (`fwd_sm90`, with its stages, key block and
    consumer warpgroups; None: its own table) or "triton" (`fwd`, with its tiles, None: stored
    or autotuned, and whether K/V come through tensor descriptors)."""

    kernel: str
    tiles: dict | None = None
    use_desc: bool = False
    sm90_stages: int | None = None
    sm90_block_n: int | None = None
    sm90_consumers: int | None = None


def _use_desc(call: Call, force: bool | None, can: Abilities) -> bool:
    """Whether the Triton forward loads K/V through tensor descriptors: ``force`` True/False
    decides (True raises where the layout cannot); by default on a Hopper GPU for 16-bit
    inputs whose keys' length bucket reaches `DESC_MIN_BUCKET`, unless SETTINGS.descriptors
    is off."""
    if force is False:
        return False
    if force is None and not (SETTINGS.descriptors and call.elem == 2
                              and seq_bucket(call.s_k) >= DESC_MIN_BUCKET and can.hopper):
        return False
    ok = can.desc_layout
    if force and not ok:
        raise ValueError("use_desc=True was asked for, but tensor descriptors are not usable "
                         "here (Triton without them, d not a power of two, or a K/V layout "
                         "whose (batch, head, seq) do not flatten into rows)")
    return ok


def forward_route(call: Call, config: KernelConfig | None, can: Abilities) -> ForwardRoute:
    """Which forward runs ``call`` (module docstring).

    A windowed call runs the Triton kernel (the Gluon forward has no window: ``sm90=True``
    raises). Otherwise ``config.sm90`` True runs the Gluon forward (raises where it cannot
    run), False the Triton one; None the rule: on a Hopper GPU whose Gluon forward takes the
    tensors (fp16/bf16, d = 64 or 128, layouts the copy engine reads), where
    `fwd_sm90.default_schedule` has a schedule (d = 128 at any length, d = 64 when both
    lengths reach `fwd_sm90.THREE_WG_MIN_LEN` for the causal flag), unless SETTINGS.sm90 is
    off.

    Packed sequences (``cu_seqlens``) follow the same rule with the longest query and key
    sequence as the lengths (the long sequences carry most of a batch's work) and run
    `fwd_sm90.attention_forward_sm90_packed`, where sequences x heads fit the grid's second
    dimension (`GRID_Y_MAX`); else the Triton kernel with pointer loads (``use_desc`` set
    raises: its descriptors' row view would cross into the next sequence). Windowed packed
    calls stay on the Triton kernel, as windowed dense ones."""
    tiles = None if config is None or config.tiles is None else config.tiles.meta()
    if call.packed and config is not None and config.use_desc:
        raise ValueError("packed sequences (cu_seqlens) run the portable Triton forward with "
                         f"pointer loads; got use_desc={config.use_desc}: leave it unset "
                         "(None) or False")
    forced = None if config is None else config.sm90
    if call.window is not None:
        if forced:
            raise ValueError(f"config sm90=True was given with window={call.window}; the "
                             "Hopper Gluon forward has no sliding window (windowed calls run "
                             "the portable Triton forward): leave sm90 unset or False")
    elif forced is not False:
        ok = can.sm90_fwd and (not call.packed or call.n_seq * call.H <= GRID_Y_MAX)
        if forced:
            if not ok:
                packed = (f", and for packed sequences at most {GRID_Y_MAX} sequences x heads; "
                          f"got {call.n_seq} x {call.H}" if call.packed else "")
                raise ValueError(
                    "sm90=True was asked for, but the Hopper forward cannot run here (it needs "
                    "Triton with Gluon, a compute capability 9.x GPU, fp16/bf16, head dim in "
                    f"{fwd_sm90.HEAD_DIMS if fwd_sm90 else (64, 128)} and 16-byte aligned "
                    f"strides with unit last stride{packed})"
                    + _import_error(fwd_sm90, "attnmem.kernels.flash.fwd_sm90"))
            return ForwardRoute("sm90", sm90_stages=config.sm90_stages,
                                sm90_block_n=config.sm90_block_n,
                                sm90_consumers=config.sm90_consumers)
        if ok and SETTINGS.sm90:
            s_q, s_k = (call.max_q, call.max_k) if call.packed else (call.s_q, call.s_k)
            schedule = fwd_sm90.default_schedule(call.d, s_q, s_k, call.causal)
            if schedule is not None:
                return ForwardRoute("sm90", sm90_consumers=schedule[0], sm90_stages=schedule[1])
    if call.packed:
        return ForwardRoute("triton", tiles)
    force = None if config is None else config.use_desc
    return ForwardRoute("triton", tiles, _use_desc(call, force, can))


def descriptors_usable(k: torch.Tensor, v: torch.Tensor, d: int, force: bool | None) -> bool:
    """Whether the Triton forward reads these K, V (head dim d) through tensor descriptors
    (`_use_desc`), False instead of an error where ``force`` is True and they cannot."""
    call = Call(k.shape[0], k.shape[1], k.shape[1], k.shape[2], k.shape[2], d, k.element_size(),
                False)
    can = Abilities(hopper=_Probe(k, k, v).hopper, desc_layout=_desc_layout(k, v, d))
    try:
        return _use_desc(call, force, can)
    except ValueError:
        return False


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                      scale: float, config: KernelConfig | None = None,
                      window: int | None = None,
                      packed: Packed | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """O (B, H, s_q, d) in q's dtype and lse2 (B, H, s_q) fp32 from the forward that
    `forward_route` picks. ``packed`` (`common.Packed`, checked by `api.flash_attention`): q is
    (1, H, total_q, d), k and v (1, H_kv, total_k, d), and so are O and lse2."""
    config = KernelConfig.of(config)
    window = check_window(window, causal, q.shape[2])
    route = forward_route(Call.of(q, k, causal, window, packed), config, probe(q, k, v))
    if route.kernel == "sm90":
        if packed is not None:
            return fwd_sm90.attention_forward_sm90_packed(q, k, v, causal, scale * LOG2E,
                                                          packed, route.sm90_stages,
                                                          route.sm90_block_n,
                                                          route.sm90_consumers)
        return fwd_sm90.attention_forward_sm90(q, k, v, causal, scale * LOG2E,
                                               route.sm90_stages, route.sm90_block_n,
                                               route.sm90_consumers)
    if packed is not None:
        return fwd.packed_forward(q, k, v, causal, scale, route.tiles, window, packed)
    return fwd.triton_forward(q, k, v, causal, scale, route.tiles, route.use_desc, window)


# ---- the backward -------------------------------------------------------------------------------

class BackwardRoute(NamedTuple):
    """The backward that runs: kernel "sm90" (`bwd_sm90`: atomic dQ, no split) or "triton"
    (`bwd`): atomic dQ or the two-kernel backward, the GQA split S, each launch's tiles (None:
    stored or autotuned; the atomic one's default `bwd.atomic_tiles`), and whether the atomic
    adds of dQ go through the copy engine."""

    kernel: str
    atomic: bool = False
    split: int = 1
    dq_tiles: dict | None = None
    dkdv_tiles: dict | None = None
    dq_tma: bool = False


def atomic_by_default(B: int, H: int, H_kv: int, s_q: int, s_k: int, d: int, elem: int,
                      deterministic: bool | None = None) -> bool:
    """Whether the backward adds dQ with atomics when no config says otherwise
    (`attnmem.calc.dispatch.atomic_dq`); never in deterministic mode (``deterministic`` None: whether
    torch.use_deterministic_algorithms(True) is in force)."""
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    return dispatch.atomic_dq(B, H, H_kv, s_q, s_k, d, elem) and not deterministic


def split_for(config: KernelConfig | None, B: int, H: int, H_kv: int, s_q: int, s_k: int,
              d: int, elem: int) -> int:
    """The config's ``kv_split`` (checked: a divisor of the group H / H_kv), else `kv_split`."""
    if config is None or config.kv_split is None:
        return kv_split(B, H, H_kv, s_q, s_k, d, elem)
    split, group = config.kv_split, H // H_kv
    if group % split:
        raise ValueError(f"kv_split must be a positive divisor of the GQA group "
                         f"H / H_kv = {H} / {H_kv} = {group}, got {split!r}")
    return split


def _sm90_bwd_choice(config: KernelConfig | None) -> bool | None:
    """What a config says of the Gluon backward, dense or packed: ``config.sm90_bwd`` when set;
    else False where SETTINGS.sm90 or SETTINGS.sm90_bwd is off or the config picks something of
    the Triton backward (`KernelConfig.triton_backward_chosen`); else None, for the default
    rule to decide."""
    forced = None if config is None else config.sm90_bwd
    if forced is not None:
        return forced
    if (not SETTINGS.sm90 or not SETTINGS.sm90_bwd
            or (config is not None and config.triton_backward_chosen())):
        return False
    return None


def _sm90_backward(call: Call, config: KernelConfig | None, can: Abilities, atomic: bool,
                   split: int) -> bool:
    """Whether the Gluon backward runs. ``config.sm90_bwd`` True forces it wherever the inputs
    allow (ValueError where it cannot run; such a call allocates the fp32 dQ buffer where the
    default backward might not, which calc's model of the default does not count), False keeps
    the Triton backward. By default it runs in attnmem.calc.dispatch's Hopper region
    (`dispatch.sm90_region`), where the rules give atomic dQ and no GQA split, so both
    backwards allocate the same buffers; with no window, on inputs `bwd_sm90.usable` accepts;
    unless SETTINGS.sm90 or SETTINGS.sm90_bwd is off or the config picks something of the
    Triton backward (`KernelConfig.triton_backward_chosen`). Timed against the Triton backward
    on the H200 in attnmem/kernels/flash/NOTES.md ("the route on by default", "the Hopper region")."""
    choice = _sm90_bwd_choice(config)
    if choice is False:
        return False
    if choice is None:
        return (atomic and split == 1 and call.window is None
                and dispatch.sm90_region(call.B, call.H_kv, call.s_q, call.s_k, call.d,
                                         call.elem)
                and can.sm90_bwd)
    if call.window is not None or not can.sm90_bwd:
        raise ValueError(
            "sm90_bwd=True: the Hopper backward needs 16-bit inputs with d = 64 or 128 on "
            "a compute-capability-9 GPU, queries a multiple of 4, layouts the copy engine "
            f"reads and no sliding window; got q {(call.B, call.H, call.s_q, call.d)} "
            f"{call.dtype} on {call.device}, window={call.window}"
            + _import_error(bwd_sm90, "attnmem.kernels.flash.bwd_sm90"))
    return True


def _sm90_packed_backward(call: Call, config: KernelConfig | None, can: Abilities) -> bool:
    """Whether the Gluon backward's packed form (`bwd_sm90.attention_backward_sm90_packed`)
    runs a packed call. ``config.sm90_bwd`` True forces it wherever the inputs allow
    (ValueError where it cannot run), False keeps the Triton two-kernel backward. By default
    where `attnmem.calc.dispatch.sm90_packed` says (16-bit, d = 64 or 128, no window, sequences x
    heads within the grid; attnmem.calc.peak counts its padded fp32 dQ buffer by the same rule) on
    inputs `bwd_sm90.usable_packed` accepts, unless SETTINGS.sm90 or SETTINGS.sm90_bwd is off,
    the config picks something of the Triton backward (`KernelConfig.triton_backward_chosen`)
    or torch.use_deterministic_algorithms(True) is in force (its dQ sums land in any order;
    the two-kernel backward is deterministic, as for dense calls).
    Windowed packed calls stay on the Triton backward: the Gluon kernel has no window."""
    choice = _sm90_bwd_choice(config)
    if choice is False:
        return False
    if choice is None:
        return (dispatch.sm90_packed(call.n_seq, call.H, call.H_kv, call.max_q, call.s_q,
                                     call.d, call.elem, call.window)
                and not can.deterministic and can.sm90_bwd_packed)
    if (call.window is not None or call.n_seq * call.H > GRID_Y_MAX
            or not can.sm90_bwd_packed):
        raise ValueError(
            "sm90_bwd=True: the Hopper backward of packed sequences needs 16-bit inputs with "
            "d = 64 or 128 on a compute-capability-9 GPU, layouts the copy engine reads, no "
            f"sliding window and at most {GRID_Y_MAX} sequences x heads; got q "
            f"{(call.H, call.s_q, call.d)} {call.dtype} on {call.device}, {call.n_seq} "
            f"sequences x {call.H} heads, window={call.window}"
            + _import_error(bwd_sm90, "attnmem.kernels.flash.bwd_sm90"))
    return True


def backward_route(call: Call, config: KernelConfig | None, can: Abilities) -> BackwardRoute:
    """Which backward runs ``call`` (module docstring).

    Packed sequences run the Gluon backward's packed form where `_sm90_packed_backward` says,
    else the two-kernel Triton backward; neither splits a GQA group (``atomic_dq`` True or
    ``kv_split`` > 1 raises). Otherwise the GQA split is
    ``config.kv_split`` or `kv_split`; dQ is added with atomics per ``config.atomic_dq``, else
    by `atomic_by_default`; the Gluon backward runs where `_sm90_backward` says, else the
    Triton one with ``config.dq_tiles`` / ``config.dkdv_tiles``, else ``config.tiles``, and
    bulk dQ adds on Hopper unless ``config.dq_tma`` is False."""
    tiles = dq_tiles = dkdv_tiles = None
    if config is not None:
        tiles = None if config.tiles is None else config.tiles.meta()
        dq_tiles = tiles if config.dq_tiles is None else config.dq_tiles.meta()
        dkdv_tiles = tiles if config.dkdv_tiles is None else config.dkdv_tiles.meta()
    if call.packed:
        if config is not None and (config.atomic_dq or (config.kv_split or 1) > 1):
            raise ValueError("packed sequences (cu_seqlens) run the Hopper backward or the "
                             "two-kernel Triton backward, without a GQA split; got "
                             f"atomic_dq={config.atomic_dq}, kv_split={config.kv_split}: "
                             "leave them unset (None), False or 1")
        if _sm90_packed_backward(call, config, can):
            return BackwardRoute("sm90", True, 1)
        return BackwardRoute("triton", False, 1, dq_tiles, dkdv_tiles)
    B, H, H_kv, s_q, s_k, d, elem = call[:7]
    split = split_for(config, B, H, H_kv, s_q, s_k, d, elem)
    if config is not None and config.atomic_dq is not None:
        atomic = config.atomic_dq
    else:
        atomic = atomic_by_default(B, H, H_kv, s_q, s_k, d, elem, can.deterministic)
    if _sm90_backward(call, config, can, atomic, split):
        return BackwardRoute("sm90", True, 1)
    dq_tma = atomic and (config is None or config.dq_tma is not False) and can.dq_tma
    return BackwardRoute("triton", atomic, split, dq_tiles, dkdv_tiles, dq_tma)


def dq_tma_usable(q: torch.Tensor, d: int, force: bool | None = None) -> bool:
    """Whether the atomic-dQ backward adds its dQ tiles with the copy engine's bulk reduce-add
    rather than element-wise atomics: on compute capability 9.0 and newer with a Triton that
    has tensor descriptors, for head dims that are powers of two; ``force`` False
    (``KernelConfig(dq_tma=False)``) keeps the element-wise adds."""
    return force is not False and probe(q, q, q).dq_tma


def attention_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       o: torch.Tensor, lse2: torch.Tensor, causal: bool, scale: float,
                       config: KernelConfig | None = None, window: int | None = None,
                       packed: Packed | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) in the inputs' dtype and shapes from the backward that
    `backward_route` picks; ``window`` and ``packed`` are the forward's. The buffers each
    backward allocates: `bwd.triton_backward`, `bwd.packed_backward`,
    `bwd_sm90.attention_backward_sm90` (the same as the Triton atomic-dQ path's),
    `bwd_sm90.attention_backward_sm90_packed` (padded lse2/delta copies and fp32 dQ rows)."""
    config = KernelConfig.of(config)
    window = check_window(window, causal, q.shape[2])
    route = backward_route(Call.of(q, k, causal, window, packed), config,
                           probe(q, k, v, do, o))
    if route.kernel == "sm90":
        if packed is not None:
            return bwd_sm90.attention_backward_sm90_packed(do, q, k, v, o, lse2, causal, scale,
                                                           packed)
        return bwd_sm90.attention_backward_sm90(do, q, k, v, o, lse2, causal, scale)
    if packed is not None:
        return bwd.packed_backward(do, q, k, v, o, lse2, causal, scale, route.dq_tiles,
                                   route.dkdv_tiles, window, packed)
    return bwd.triton_backward(do, q, k, v, o, lse2, causal, scale, route.atomic, route.split,
                               route.dq_tiles, route.dkdv_tiles, route.dq_tma, window)
