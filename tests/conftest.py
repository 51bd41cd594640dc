"""Shared test set-up: deterministic torch, modest threading on the 2-core CI machine."""

import pytest
import torch

torch.set_num_threads(1)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    return request.param
