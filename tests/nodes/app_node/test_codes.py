"""app-node's HTTP error codes: one vocabulary, in the RPC layer's spelling, one table."""

import re

from nodes.app_node import codes, errors
from nodes.app_node.api import ApiError

_RPC_STYLE = re.compile(r"^[A-Z][A-Z0-9]*(_[A-Z0-9]+)*$")


def test_every_code_is_spelled_like_the_rpc_codes_and_has_a_status() -> None:
    names = [name for name in codes.__all__ if name != "STATUS"]
    for name in names:
        value = getattr(codes, name)
        assert value == name and _RPC_STYLE.match(value), name
        assert value in codes.STATUS or value == codes.HTTP_ERROR, name
    assert set(codes.STATUS) <= set(names)


def test_every_store_error_code_is_in_the_table() -> None:
    pending = [errors.AppNodeError]
    while pending:
        cls = pending.pop()
        assert cls.code in codes.STATUS, cls
        pending += cls.__subclasses__()


def test_an_api_error_takes_its_status_from_the_table_unless_told() -> None:
    assert ApiError(codes.THROTTLED, "slow down").status == 429
    assert ApiError.of(errors.Expired("too late")).status == 410
    assert ApiError(codes.HTTP_ERROR, "teapot", status=418).status == 418
