"""Chat-template prompts render as transformers' apply_chat_template renders them; plain text without a template."""

import json
import re

import pytest

from nibble.tasks.chat import PromptFormat

transformers = pytest.importorskip("transformers")

# A template using what real ones use beyond SmolLM2's: bos_token, raise_exception, loop controls, tojson.
FEATURES_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}{% if m['content'] == 'skip' %}{% continue %}"
    "{% endif %}<|{{ m['role'] }}|>\n{{ m['content'] | trim }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{{ {'k': 'é'} | tojson }}\n{% endif %}"
)


def reference(folder, messages):
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


@pytest.mark.parametrize("system", [None, "Solve it. End with 'The answer is N.'"])
def test_smollm2_template_renders_like_transformers(system, smollm2_dir):
    problem = "Janet has 3 ducks.\nHow many legs do they have?"
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": problem}]
    text = PromptFormat.from_model_dir(smollm2_dir, system_prompt=system).render(problem)
    assert text == reference(smollm2_dir, messages)
    assert text.endswith("<|im_start|>assistant\n") and problem in text


def test_special_tokens_and_template_functions_render_like_transformers(tmp_path, smollm2_dir):
    config = json.loads((smollm2_dir / "tokenizer_config.json").read_text())
    config.update(chat_template=FEATURES_TEMPLATE, bos_token="<|im_start|>", eos_token="<|im_end|>")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "tokenizer.json").write_bytes((smollm2_dir / "tokenizer.json").read_bytes())
    text = PromptFormat.from_model_dir(tmp_path, system_prompt="be brief ").render("2+2?")
    assert text == reference(
        tmp_path, [{"role": "system", "content": "be brief "}, {"role": "user", "content": "2+2?"}]
    )
    assert text.startswith("<|im_start|><|system|>\nbe brief<|im_end|>")


def test_a_template_that_raises_is_a_value_error_naming_its_source():
    template = "{{ raise_exception('system turns are not supported') }}"
    with pytest.raises(ValueError, match=re.escape("here: rendering failed (system turns are not supported")):
        PromptFormat(template, source="here").render("x")


def test_bad_templates_and_configs_are_named(tmp_path):
    with pytest.raises(ValueError, match="here: not a valid Jinja template"):
        PromptFormat("{% for m in messages %}", source="here")
    (tmp_path / "tokenizer_config.json").write_text('{"chat_template": [{"name": "tool_use", "template": "x"}]}')
    with pytest.raises(
        ValueError, match=re.escape("tokenizer_config.json: chat_template lists templates ['tool_use'] but none")
    ):
        PromptFormat.from_model_dir(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ValueError, match=re.escape("tokenizer_config.json: cannot read it as JSON")):
        PromptFormat.from_model_dir(tmp_path)


def test_without_a_template_prompts_are_plain_text(tmp_path):
    plain = PromptFormat.from_model_dir(tmp_path, system_prompt="Be exact.")
    assert not plain.is_chat
    assert plain.render("1+1?") == "Be exact.\n\n1+1?\n"
    assert PromptFormat(None).render("1+1?") == "1+1?\n"
