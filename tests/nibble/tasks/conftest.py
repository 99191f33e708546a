"""Fixtures of the task tests: SmolLM2-135M-Instruct's real tokenizer directory, unpacked once per session."""

import pytest

from tests.nibble.tasks.smollm2 import unpack_smollm2_tokenizer


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
    """A model-style directory holding SmolLM2's ``tokenizer.json`` and ``tokenizer_config.json`` (chat template)."""
    return unpack_smollm2_tokenizer(tmp_path_factory.mktemp("smollm2"))
