"""Whether this server may start GPU measurements: the exposure setting.

The measurement page starts work on the GPU of the machine that serves the app. On the
default address (127.0.0.1, .streamlit/config.toml) only this machine can reach it. When the
user opts into another address (`--server.address 0.0.0.0`), anyone who can reach the port
could keep the GPU busy, so measuring is switched off unless the user says otherwise:

    ATTNMEM_DISABLE_MEASURE=1   never measure (the page shows results and uploads only)
    ATTNMEM_DISABLE_MEASURE=0   measure even on a non-loopback address (a trusted network)
    unset                       measure only while the server listens on loopback

Any other value switches measuring off (a typo must not expose the GPU). Stdlib only; the
Streamlit address is read lazily, so the command line and tests import this freely.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping

ENV = "ATTNMEM_DISABLE_MEASURE"
_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")
_UNSET = object()


def is_loopback(address: str | None) -> bool:
    """True for 127.0.0.0/8, ::1 and 'localhost'. None or '' mean Streamlit's default of every
    interface, which is not loopback."""
    if not address:
        return False
    host = address.strip().strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def server_address() -> str | None:
    """The address the Streamlit server was told to listen on (server.address), if known."""
    try:
        from streamlit import config

        value = config.get_option("server.address")
    except Exception:  # noqa: BLE001 - no Streamlit, or not running under it
        return None
    return value or None


def measurement_block_reason(env: Mapping[str, str] | None = None,
                             address: object = _UNSET) -> str | None:
    """None when this server may measure on the GPU; else why not, in words for the page."""
    env = os.environ if env is None else env
    setting = env.get(ENV, "").strip().lower()
    if setting in _ON:
        return (f"GPU measurement is switched off on this server ({ENV}={env.get(ENV)}). "
                "Results already stored, the bundled reference and uploaded CSVs are shown.")
    if setting and setting not in _OFF:
        return (f"GPU measurement is switched off: {ENV}={env.get(ENV)!r} is not 0 or 1 "
                "(an unclear setting never exposes the GPU).")
    if setting in _OFF:
        return None
    where = server_address() if address is _UNSET else address
    if not is_loopback(where if isinstance(where, str) or where is None else str(where)):
        shown = where or "every network interface"
        return (f"GPU measurement is switched off because this server listens on {shown}, "
                "not only on this machine: anyone who can reach it could keep the GPU busy. "
                f"On a network you trust, start it with {ENV}=0 to allow measuring.")
    return None
