"""The server's settings in .streamlit/config.toml: no file watcher on the project tree.

With the default watcher Streamlit watched the whole checkout (.venv included) and filled
`make app`'s terminal with "Inotify queue overflowed" (issue 32, item 6).
"""

from __future__ import annotations

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]


def test_server_runs_without_a_file_watcher() -> None:
    from streamlit import config

    settings = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert settings["server"]["fileWatcherType"] == "none"
    # the option exists under this name in the installed Streamlit (a misspelt key is ignored)
    assert "server.fileWatcherType" in config._config_options_template
