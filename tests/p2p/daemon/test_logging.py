"""configure_logging: one handler on the root, and per-request library lines
(httpx's "HTTP Request: ...") kept out unless the daemon runs at debug."""

from __future__ import annotations

import io
import logging

import pytest

from p2p.daemon import configure_logging


@pytest.fixture(autouse=True)
def _restore_logging():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    httpx_level = logging.getLogger("httpx").level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.getLogger("httpx").setLevel(httpx_level)


@pytest.mark.parametrize(("level", "shown"), [("info", False), ("debug", True)])
def test_httpx_request_lines_show_only_at_debug(level, shown):
    out = io.StringIO()
    configure_logging(level, stream=out, format="text")
    logging.getLogger("httpx").info("HTTP Request: GET http://127.0.0.1/health 200")
    logging.getLogger("httpx").warning("cannot reach Loki")
    logging.getLogger("nodes.example").info("job created")
    text = out.getvalue()
    assert ("HTTP Request" in text) is shown
    assert "cannot reach Loki" in text and "job created" in text
    assert len(logging.getLogger().handlers) == 1
