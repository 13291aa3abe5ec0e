import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

import torch_rtindex  # noqa: E402  (builds the extension once, before collection of the tests)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def pytest_report_header(config):
    info = torch_rtindex._extension.load()
    return [f"torch_rtindex backend: {info['backend']}; devices under test: {', '.join(DEVICES)}"]


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)
