"""Character and Hugging Face tokenizers: round trips, special ids, and errors that name what is wrong."""

import json
import shutil

import pytest
from tokenizers import Tokenizer as Backend
from tokenizers.models import WordLevel

from nibble.tasks.tokenizers import CharTokenizer, HFTokenizer
from tests.helpers import minilm_tokenizer_json


def test_char_tokenizer_round_trips_and_reserves_the_special_ids():
    tok = CharTokenizer("0123456789+=")
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.vocab_size) == (0, 1, 2, 15)
    ids = tok.encode("123+45=")
    assert ids == [4, 5, 6, 13, 7, 8, 14]
    assert tok.decode(ids) == "123+45="
    assert tok.decode([tok.bos_id, *ids, tok.eos_id, tok.pad_id]) == "<bos>123+45=<eos><pad>"
    assert tok.encode("") == [] and tok.decode([]) == ""


def test_char_tokenizer_names_an_unknown_character_and_its_position():
    with pytest.raises(ValueError, match=r"character 'x' at position 2 of '12x4'"):
        CharTokenizer("0123456789").encode("12x4")


@pytest.mark.parametrize(
    ("alphabet", "message"),
    [("", "non-empty string"), (None, "non-empty string"), ("abca", "repeats the character 'a'")],
)
def test_char_tokenizer_rejects_a_bad_alphabet(alphabet, message):
    with pytest.raises(ValueError, match=message):
        CharTokenizer(alphabet)


def test_char_tokenizer_decode_rejects_ids_outside_the_vocabulary():
    with pytest.raises(ValueError, match=r"token id 5 at position 1 is outside the vocabulary \[0, 5\)"):
        CharTokenizer("ab").decode([3, 5])


def test_hf_tokenizer_round_trips_minilm_text_without_padding_or_special_tokens():
    tok = HFTokenizer(minilm_tokenizer_json())
    text = "the quick brown fox jumps over the lazy dog 12 + 30 = 42"
    ids = tok.encode(text)
    assert len(ids) == 14  # MiniLM's tokenizer.json pads every encoding to 128 unless told not to
    assert tok.decode(ids) == text
    assert len(tok.encode("word " * 1000)) == 1000  # and truncates at 512
    assert tok.vocab_size == 30522


def test_hf_tokenizer_finds_special_ids_from_the_config_beside_it():
    tok = HFTokenizer(minilm_tokenizer_json().parent)  # a directory works too
    # BERT has no eos/bos: [SEP] and [CLS] (from tokenizer_config.json) stand in.
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 101, 102)
    assert tok.decode([tok.bos_id, *tok.encode("hello"), tok.eos_id]) == "[CLS] hello [SEP]"


def tiny_tokenizer(folder, tokens, **config):
    vocab = {token: i for i, token in enumerate(tokens)}
    Backend(WordLevel(vocab, unk_token=tokens[0])).save(str(folder / "tokenizer.json"))
    if config:
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder / "tokenizer.json"


def test_hf_tokenizer_prefers_explicit_then_config_then_well_known_names(tmp_path):
    path = tiny_tokenizer(tmp_path, ["<unk>", "a", "</s>", "<end>", "<s>"], eos_token={"content": "<end>"})
    assert HFTokenizer(path).eos_id == 3
    assert HFTokenizer(path, eos_token="a").eos_id == 1
    (tmp_path / "tokenizer_config.json").unlink()
    tok = HFTokenizer(path)
    assert (tok.eos_id, tok.bos_id, tok.pad_id) == (2, 4, 2)  # no pad token: pad falls back to eos


def test_hf_tokenizer_without_an_eos_token_is_an_error_naming_the_file(tmp_path):
    path = tiny_tokenizer(tmp_path, ["<unk>", "a", "b"])
    with pytest.raises(ValueError, match="cannot determine the eos token") as info:
        HFTokenizer(path)
    assert str(path) in str(info.value)
    with pytest.raises(ValueError, match="eos_token='zzz' is not in the vocabulary"):
        HFTokenizer(path, eos_token="zzz")


def test_hf_tokenizer_without_config_files_falls_back_to_minilm_sep(tmp_path):
    shutil.copy(minilm_tokenizer_json(), tmp_path / "tokenizer.json")
    tok = HFTokenizer(tmp_path / "tokenizer.json")
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 101, 102)


def test_hf_tokenizer_bad_paths_are_named(tmp_path):
    missing = tmp_path / "nope" / "tokenizer.json"
    with pytest.raises(ValueError, match="no such tokenizer file") as info:
        HFTokenizer(missing)
    assert str(missing) in str(info.value)
    bogus = tmp_path / "tokenizer.json"
    bogus.write_text("{not json")
    with pytest.raises(ValueError, match=r"not a valid Hugging Face tokenizer\.json") as info:
        HFTokenizer(tmp_path)
    assert str(bogus) in str(info.value)
