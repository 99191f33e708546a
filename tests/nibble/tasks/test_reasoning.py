"""reasoning-gym training problems with GSM8K / MATH-500 / generated problems held out, in a real chat template."""

import pytest

from nibble.tasks import ReasoningGymTask, get_task
from nibble.tasks.eval_sets import gsm8k_test
from nibble.tasks.reasoning import DEFAULT_SYSTEM_PROMPT, gsm_symbolic_sources


@pytest.fixture(scope="module")
def gsm(smollm2_dir):
    return get_task("reasoning_gym", dataset="gsm_symbolic", tokenizer=str(smollm2_dir))


def test_training_streams_are_seeded_and_never_show_a_held_out_problem(gsm, smollm2_dir):
    train = gsm.train_examples(40, seed=3)
    assert train == ReasoningGymTask("gsm_symbolic", tokenizer=smollm2_dir).train_examples(40, seed=3)
    assert [e.id for e in train] != [e.id for e in gsm.train_examples(40, seed=4)]
    assert len({e.id for e in train}) == 40
    assert not {e.prompt for e in train} & {e.prompt for e in gsm.eval_examples()}
    assert all(e.prompt.endswith("Give the result as your final answer. Do not include units.") for e in train)


@pytest.mark.parametrize("dataset", ["basic_arithmetic", "chain_sum", "gsm_symbolic"])
def test_reasoning_gym_answers_score_one_and_others_less(dataset, smollm2_dir):
    task = ReasoningGymTask(dataset, tokenizer=smollm2_dir, held_out="generated", eval_size=20)
    examples = task.train_examples(20, seed=0) + task.eval_examples()
    for example in examples:
        assert task.reward(example, f"Let me work it out.\nThe answer is {example.answer}.") == 1.0
        assert task.reward(example, f"<answer>{example.answer}</answer>") == 1.0
        assert task.reward(example, "I cannot solve this.") == 0.0
        wrong = str(int(float(example.answer)) + 1)
        assert task.reward(example, f"The answer is {wrong}.") < 1.0
    assert {e.id for e in task.eval_examples()}.isdisjoint(e.id for e in task.train_examples(500, seed=0))


def test_gsm8k_is_held_out_without_the_problems_gsm_symbolic_templates_came_from(gsm, smollm2_dir):
    sources = gsm_symbolic_sources()
    assert len(sources) == 100  # one per template: reasoning-gym 0.1.25 ships 100
    assert {"gsm8k:989", "gsm8k:432"} <= sources  # "Emily can peel 6 shrimp a minute...", "Prince Thaddeus slew"
    held_out = gsm.eval_examples()
    assert len(held_out) == 1319 - len(sources) and not {e.id for e in held_out} & sources
    plain = ReasoningGymTask("chain_sum", tokenizer=smollm2_dir, held_out="gsm8k", eval_size=1319)
    assert plain.eval_examples() == list(gsm8k_test())  # nothing to decontaminate when not training on its templates


def test_prompts_are_the_models_chat_template_token_for_token(gsm, smollm2_dir):
    transformers = pytest.importorskip("transformers")
    reference = transformers.AutoTokenizer.from_pretrained(smollm2_dir)
    for example in [*gsm.eval_examples()[:3], *gsm.train_examples(3, seed=0)]:
        messages = [{"role": "system", "content": DEFAULT_SYSTEM_PROMPT}, {"role": "user", "content": example.prompt}]
        expected = reference.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        expected = list(expected["input_ids"] if hasattr(expected, "keys") else expected)  # transformers 5: a dict
        assert gsm.prompt_ids(example) == expected
    assert gsm.tokenizer.decode([gsm.tokenizer.eos_id]) == "<|im_end|>"  # the turn's end stops generation


def test_without_a_chat_template_prompts_are_bos_and_plain_text(smollm2_dir):
    task = ReasoningGymTask("chain_sum", tokenizer=smollm2_dir, chat_template=False, system_prompt=None)
    example = task.eval_examples()[0]
    ids = task.prompt_ids(example)
    assert ids[0] == task.tokenizer.bos_id and task.tokenizer.decode(ids[1:]) == example.prompt + "\n"


def test_math500_rewards_equivalent_latex(smollm2_dir):
    task = ReasoningGymTask("gsm_symbolic", tokenizer=smollm2_dir, held_out="math500", eval_size=3)
    polar, _, fraction = task.eval_examples()
    assert task.reward(polar, "So the point is $\\boxed{\\left(3, \\frac{\\pi}{2}\\right)}$.") == 1.0
    assert task.reward(polar, "So the point is $\\boxed{(3, \\pi)}$.") == 0.0
    assert task.reward(fraction, "The answer is $\\frac{28}{6}$.") == 1.0
    assert task.reward(fraction, "No idea.") == 0.0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"dataset": "gsm9k"}, "dataset='gsm9k' is not one of basic_arithmetic, chain_sum, gsm_symbolic"),
        ({"held_out": "svamp"}, "held_out='svamp' is not one of gsm8k, math500, generated"),
        ({"eval_size": 0}, "eval_size=0 must be an int >= 1"),
        (
            {"eval_size": 2000, "held_out": "math500"},
            "eval_size=2000 is more than the 500 problems of held_out='math500'",
        ),
        ({"dataset_options": {"seed": 3}}, "dataset_options may not set seed"),
        (
            {"dataset": "chain_sum", "dataset_options": {"min_terms": 0}},
            "dataset_options=.'min_terms': 0. for 'chain_sum'",
        ),
        ({"dataset": "chain_sum", "dataset_options": {"terms": 3}}, "dataset_options=.'terms': 3. for 'chain_sum'"),
        ({"held_out": "math500", "decontaminate": True}, "decontaminate=True applies to held_out='gsm8k' only"),
        ({"max_response_tokens": -1}, "max_response_tokens=-1 must be an int >= 1"),
        ({"system_prompt": 3}, "system_prompt must be a string or null, got int"),
    ],
)
def test_bad_options_are_named(options, message, smollm2_dir):
    with pytest.raises(ValueError, match=message):
        get_task("reasoning_gym", tokenizer=str(smollm2_dir), **options)


def test_missing_tokenizer_and_unknown_options_are_named(tmp_path, smollm2_dir):
    with pytest.raises(ValueError, match="no such tokenizer file"):
        get_task("reasoning_gym", tokenizer=str(tmp_path))
    with pytest.raises(
        ValueError, match="task 'reasoning_gym' has no option 'heldout'; its options: dataset, tokenizer"
    ):
        get_task("reasoning_gym", tokenizer=str(smollm2_dir), heldout="gsm8k")
    with pytest.raises(ValueError, match="task 'reasoning_gym': bad options"):
        get_task("reasoning_gym")


def test_a_run_config_names_the_task(tmp_path, smollm2_dir):
    from nibble.config import load

    path = tmp_path / "run.yaml"
    path.write_text(
        "task:\n  name: reasoning_gym\n  options:\n    dataset: gsm_symbolic\n"
        f"    tokenizer: {smollm2_dir}\n    held_out: gsm8k\n    eval_size: 256\n    max_response_tokens: 512\n"
    )
    config = load(path)
    with get_task(config.task.name, **config.task.options) as task:
        assert isinstance(task, ReasoningGymTask) and len(task.eval_examples()) == 256
        assert task.eval_examples()[0].id == "gsm8k:0" and task.max_response_tokens == 512
