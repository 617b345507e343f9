"""p2p.rpc._models: the direct pydantic-core path behaves as the model's own methods."""

import pydantic
import pytest

from p2p.rpc._models import dump, validate


class Plain(pydantic.BaseModel):
    n: int
    tag: str = "x"


class Custom(pydantic.BaseModel):
    n: int

    def model_dump(self, **kwargs):
        return {"n": self.n, "custom": True}

    @classmethod
    def model_validate(cls, obj, **kwargs):
        return super().model_validate({"n": obj["n"] + 1})


def test_plain_models_validate_and_dump_as_their_methods_do():
    assert validate(Plain, {"n": "3"}) == Plain.model_validate({"n": "3"})
    assert dump(Plain(n=3)) == Plain(n=3).model_dump(mode="python")
    with pytest.raises(pydantic.ValidationError):
        validate(Plain, {"n": "three"})


def test_models_that_override_the_methods_go_through_them():
    assert dump(Custom(n=1)) == {"n": 1, "custom": True}
    assert validate(Custom, {"n": 1}).n == 2
