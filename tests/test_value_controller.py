"""The value controller: options that name the step they blame, pairs ranked by hindsight values, a
scalar-head model whose shared-prefix scoring equals whole-sequence scoring, a When and a Where that
act on the best option's gain, and `rir train value` end to end on the tiny model."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from data_gen.scoring.answers import share_by_source
from data_gen.value_rows import ranked_pairs
from rir_runtime.controllers import make_controller
from rir_runtime.controllers.options import CONTINUE, option_text, recovery_options, value_prompt
from rir_runtime.controllers.value import ValueController
from rir_runtime.envs.checkpoints import Step
from rir_runtime.errors import UserInputError
from rir_runtime.prompts import DecisionContext
from tests.training import FAST
from train.value import balanced_pairs, contrast

HISTORY = (
    Step(0, "read notebook", "The notebook reads: grind the garlic; slice the apple.", 20.0),
    Step(1, "go to garden", "You are at the garden. You see garlic, apple.", 20.0),
    Step(2, "take garlic", "You take the garlic.", 20.0),
    Step(3, "chill garlic", "You chill the garlic.", 40.0),
    Step(4, "go to garden", "You are at the garden. You see apple.", 40.0),
    Step(5, "take apple", "You take the apple.", 40.0),
)


def context(trigger: str = "schedule", admissible: tuple[int, ...] = tuple(range(7))) -> DecisionContext:
    return DecisionContext("builtin/workshop-2/dev/0", "Cook.", "", HISTORY, "You take the apple.", 40.0,
                           trigger, admissible)  # fmt: skip


# --- options ----------------------------------------------------------------------------------------
def test_options_name_the_action_they_undo_and_tell_repeats_apart() -> None:
    ctx = context()
    assert option_text(ctx, 3) == "Option: go back to before 'chill garlic' and never do it there again."
    assert "the 2nd 'go to garden'" in option_text(ctx, 4) and "the 1st 'go to garden'" in option_text(ctx, 1)
    assert option_text(ctx, 6).startswith("Option: stay here and stop doing '")  # a stay blames the suspect step
    options = recovery_options(ctx, with_continue=True)
    assert options[0].text == CONTINUE and [o.checkpoint for o in options[1:]] == [6, 5, 4, 3, 2, 1, 0]
    assert all(o.checkpoint is not None for o in recovery_options(ctx, with_continue=False))


def test_the_prompt_keeps_what_was_read_and_the_score_changes() -> None:
    prompt = value_prompt(context())
    assert "1. read notebook (score 20) -> The notebook reads: grind the garlic" in prompt
    assert "4. chill garlic (score 40)\n" in prompt  # no reply: neither read, first nor last
    assert "6. take apple -> You take the apple." in prompt and prompt.endswith("Which option leads to success?\n")


# --- pairs ------------------------------------------------------------------------------------------
def test_pairs_put_the_best_option_first_against_the_nearest_worse_ones_then_its_ties() -> None:
    values = {None: 0.0, 0: 0.0, 1: 0.0, 2: 0.0, 3: 1.0, 4: 0.0, 5: 0.0, 6: 0.0}
    assert ranked_pairs(values, 4) == [(3, None), (3, 4), (3, 2), (3, 5)]
    clean = {None: 1.0, 0: 1.0, 5: 1.0, 6: 1.0}  # nothing to recover from: going on must win the ties
    assert ranked_pairs(clean, 8) == [(None, 6), (None, 5), (None, 0)]
    assert ranked_pairs({4: 1.0, 6: 1.0, 2: 0.6}, 8) == [(6, 4)]  # 0.4 below is within the margin: no pair


def pair_meta(episode: str, step: int, chosen: int, rejected: int) -> dict[str, object]:
    return {"episode_id": episode, "step": step, "chosen_option": chosen, "rejected_option": rejected}


def test_balanced_pairs_teach_the_three_contrasts_equally_and_go_on_against_the_latest_checkpoint() -> None:
    """Built pairs are mostly going on against far checkpoints (a clean point sets it against each one);
    a recovery beating going on is rare. Balanced: equal shares, one go-on pair per point (its latest)."""
    metas = [pair_meta(f"clean{e}", 8, -1, c) for e in range(10) for c in (0, 3, 7)]  # go on wins: 30 pairs
    metas += [pair_meta(f"bad{e}", 8, 4, -1) for e in range(4)]  # a recovery wins: 4 pairs
    metas += [pair_meta(f"bad{e}", 8, 4, c) for e in range(4) for c in (3, 5)]  # the Where: 8 pairs
    picked = balanced_pairs(metas, cap=12, seed=0)
    kinds = Counter(contrast(metas[i]) for i in picked)
    assert len(picked) == len(set(picked)) == 12 and kinds == {"recover": 4, "go on": 4, "where": 4}, kinds
    assert all(metas[i]["rejected_option"] == 7 for i in picked if contrast(metas[i]) == "go on")
    short = balanced_pairs(metas, cap=24, seed=0)  # 4 recover pairs only: the others fill their share
    assert Counter(contrast(metas[i]) for i in short) == {"recover": 4, "go on": 10, "where": 8}
    assert len(balanced_pairs(metas, cap=None, seed=0)) == 12  # uncapped: the rarest contrast's count each
    assert balanced_pairs(metas, 12, seed=0) == picked and balanced_pairs(metas, 12, seed=1) != picked


def test_value_pairs_share_the_cap_equally_between_rollout_folders() -> None:
    """Shuffled alone, 90 workshop pairs and 6 TextWorld ones would give a cap of 12 about one TextWorld
    pair; shared by folder, the small folder gives all it has and the large one fills the rest."""
    metas = [{"source_run": "runs/r/rollout-builtin"}] * 90 + [{"source_run": "runs/r/rollout-textworld"}] * 6
    metas += [{"source_run": "runs/r/rollout-scienceworld"}] * 20
    picked = share_by_source(metas, 15)
    by_folder = Counter(metas[i]["source_run"].rsplit("-", 1)[1] for i in picked)
    assert len(picked) == len(set(picked)) == 15 and by_folder == {"builtin": 5, "textworld": 5, "scienceworld": 5}
    few = Counter(metas[i]["source_run"].rsplit("-", 1)[1] for i in share_by_source(metas, 30))
    assert few == {"textworld": 6, "scienceworld": 12, "builtin": 12}  # 6 is all TextWorld has: the rest share


# --- the controller, with a scorer that reads the text ---------------------------------------------
class Reader:
    """A stand-in scorer: high for the option that names `culprit`, `base` for going on."""

    def __init__(self, culprit: str, base: float = 0.0) -> None:
        self.culprit, self.base, self.calls = culprit, base, 0

    def score(self, prompt: str, options: list[str]) -> list[float]:
        self.calls += 1
        return [self.base if o == CONTINUE else (2.0 if f"before '{self.culprit}'" in o else -1.0) for o in options]


def test_it_recovers_where_the_best_option_beats_going_on_by_the_margin_and_its_where_is_free() -> None:
    scorer = Reader("chill garlic")
    controller = ValueController(scorer, "value:test", margin=1.0)
    review = controller.review(context())
    assert review.value.recover and review.meta["restore"] == 3 and review.model_calls == 1
    assert review.meta["margin"] == pytest.approx(2.0)
    ctx = context("locate")
    coarse = controller.locate_coarse(ctx)
    fine = controller.locate_fine(ctx)
    assert fine.value == 3 and coarse.model_calls == fine.model_calls == 0 and scorer.calls == 1
    cautious = ValueController(Reader("chill garlic"), "value:test", margin=2.5)
    assert not cautious.review(context()).value.recover  # a gain of 2.0 is below its margin


def test_after_a_failed_ending_its_where_costs_one_pass_over_the_restore_options() -> None:
    scorer = Reader("chill garlic")
    controller = ValueController(scorer, "value:test")
    ended = context("locate", admissible=tuple(range(6)))  # the current checkpoint is gone at the end
    assert controller.locate_coarse(ended).model_calls == 1 and controller.locate_fine(ended).value == 3


def test_a_long_branch_is_valued_on_every_checkpoint_up_to_the_cap() -> None:
    """A value is a spike at the step to blame: every checkpoint is scored (in batches over one cache)."""
    long = tuple(Step(i, f"step {i}", "ok", 0.0) for i in range(80))
    ctx = DecisionContext("t", "goal", "", long, "ok", 0.0, "schedule", tuple(range(81)))
    assert ValueController(Reader("step 37"), "value:test").review(ctx).meta["restore"] == 37
    capped = ValueController(Reader("step 37"), "value:test", max_options=12)
    assert capped._considered(ctx) == [0, *range(70, 81)]  # beyond the cap: the latest ones and the start


def test_value_controllers_are_named_by_their_adapter_folder(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="does not exist"):
        make_controller(f"value:{tmp_path / 'missing'}")


# --- the model: shared-prefix scoring ------------------------------------------------------------------
def test_scoring_options_over_the_prompts_cache_equals_scoring_whole_sequences() -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from rir_runtime.llm.registry import local_path
    from rir_runtime.llm.value import ValueScorer

    path = str(local_path("tiny-random-llama"))
    tokenizer = AutoTokenizer.from_pretrained(path)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
    model = get_peft_model(model, LoraConfig(task_type="SEQ_CLS", r=4, target_modules=["q_proj", "v_proj"]))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            param.data.normal_(0, 0.5)  # a trained-looking adapter, not the identity it starts as
    scorer = ValueScorer(model, tokenizer)
    ctx = context()
    texts = [o.text for o in recovery_options(ctx, with_continue=True)] * 3  # more than one batch of 16
    cached, whole = scorer.score(value_prompt(ctx), texts), scorer.score_uncached(value_prompt(ctx), texts)
    assert max(abs(a - b) for a, b in zip(cached, whole, strict=True)) < 1e-4
    assert len(set(round(x, 4) for x in cached[:7])) > 1  # the options are told apart


def test_the_served_score_is_the_one_the_reward_trainer_trains() -> None:
    """The scorer reads the head where TRL's `RewardTrainer` pools it: the rightmost token that is not
    padding, in right-padded batches through the model's own forward. (Options once ended with the
    end-of-text token while padding was that same token: training pooled one token earlier than
    serving read, and the served scores were of a position never trained.)"""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForSequenceClassification
    from trl.trainer.reward_trainer import DataCollatorForPreference

    from rir_runtime.llm.registry import local_path
    from rir_runtime.llm.value import ValueScorer, encode
    from train.value import value_tokenizer

    path = str(local_path("tiny-random-llama"))
    tokenizer = value_tokenizer(path)
    tokenizer.pad_token = tokenizer.eos_token  # as small chat models ship (SmolLM2: both <|im_end|>)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
    model.config.pad_token_id = tokenizer.pad_token_id
    model = get_peft_model(model, LoraConfig(task_type="SEQ_CLS", r=4, target_modules=["q_proj", "v_proj"]))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            param.data.normal_(0, 0.5)
    ctx = context()
    prompt, (short, long) = value_prompt(ctx), (CONTINUE, option_text(ctx, 3))
    short_ids, long_ids = (sum(encode(tokenizer, prompt, option), []) for option in (short, long))
    rows = [{"chosen_ids": short_ids, "rejected_ids": long_ids}]
    batch = DataCollatorForPreference(pad_token_id=tokenizer.pad_token_id)(rows)  # right-padded, as trained
    with torch.no_grad():
        trained = model(**batch, use_cache=False).logits.squeeze(-1).tolist()
    served = ValueScorer(model, tokenizer).score(prompt, [short, long])
    assert served == pytest.approx(trained, abs=1e-4)


# --- rir train value, end to end ------------------------------------------------------------------------
def test_value_pairs_rank_options_by_the_agents_own_values(value_data: Path) -> None:
    from datasets import load_from_disk

    rows = load_from_disk(str(value_data / "value_pref"))["train"]
    assert len(rows) > 20
    for row in rows:
        values = json.loads(row["meta"]["option_values"])
        chosen, rejected = row["meta"]["chosen_option"], row["meta"]["rejected_option"]
        better = values["continue" if chosen == -1 else str(chosen)]
        worse = values["continue" if rejected == -1 else str(rejected)]
        assert better >= worse and row["chosen"] != row["rejected"] and row["prompt"].startswith("Task: ")


def test_rir_train_value_writes_an_adapter_that_serves_as_a_controller(value_data: Path, tmp_path: Path) -> None:
    from rir_runtime.cli import main as rir
    from rir_runtime.envs import TaskSpec
    from rir_runtime.llm.value import load_value_scorer
    from rir_runtime.orchestration.jobs import EpisodeJob, run_job

    out = tmp_path / "value"
    argv = ["train", "value", "--model", "tiny-random-llama", "--data", str(value_data), "--output_dir", str(out),
            "--max_steps", "3", "--per_device_train_batch_size", "2", "--use_cpu", "true", "--bf16", "false",
            "--lora_target_modules", "q_proj", "v_proj", "--report_to", "none", "--save_strategy", "no",
            "--eval_strategy", "no", "--calibration_rows", "16", "--logging_steps", "1"]  # fmt: skip
    assert rir(argv) == 0
    card = json.loads((out / "rir_controller.json").read_text())
    assert card["kind"] == "value" and card["stage"] == "value" and card["decision_types"] == ["review", "locate"]
    assert card["label_values"]["label_value"] == "agent-lesson" and card["review_threshold"] is not None
    state = json.loads((out / "trainer_state.json").read_text())
    assert any("loss" in entry for entry in state["log_history"])
    controller = make_controller(f"value:{out}")
    assert isinstance(controller, ValueController) and controller.uses_model
    served = load_value_scorer(out)  # the LoRA merged in, the same scores as the adapter applied
    assert not any("lora_" in name for name, _ in served.model.named_parameters())
    unmerged = load_value_scorer(out, merge=False)
    ctx = context()
    texts = [o.text for o in recovery_options(ctx, with_continue=True)]
    assert served.score(value_prompt(ctx), texts) == pytest.approx(unmerged.score(value_prompt(ctx), texts), abs=1e-4)
    job = EpisodeJob(TaskSpec("builtin", "workshop-3", "dev", 0), "rir", f"value:{out}", "noisy-expert", "rank",
                     0.3, 0, "40", 1, 100, 8)  # fmt: skip
    record = run_job(job)
    reviews = [e for e in record.events if e.type == "review"]
    # one batched pass per review (its Where reuses it), one per Where after a failed ending
    assert record.controller == f"value:{out}" and reviews and record.controller_calls == len(reviews)


VALUE_CONFIGS = sorted((Path(__file__).parent.parent / "configs" / "train").glob("value_*.yaml"))


@pytest.mark.parametrize("config", VALUE_CONFIGS, ids=[c.stem for c in VALUE_CONFIGS])
def test_shipped_value_config_builds_and_trains_one_step(config: Path, value_data: Path, tmp_path: Path) -> None:
    """GPU configs too, on the tiny model on CPU: a typo or an incompatible option fails here."""
    from train import value
    from train.common.args import parse_train_args

    argv = ["--config", str(config), *FAST, "--data", str(value_data), "--output_dir", str(tmp_path / "out"),
            "--max_steps", "1", "--eval_strategy", "no", "--per_device_train_batch_size", "2",
            "--gradient_accumulation_steps", "1", "--max_train_samples", "4"]  # fmt: skip
    if "lora_top_layers" in config.read_text():
        argv += ["--lora_top_layers", "1"]  # the tiny model has 2 layers
    trainer, card = value.build_trainer(*parse_train_args(value.make_parser(), argv))
    trainer.train()
    assert trainer.state.global_step == 1 and card["stage"] == "value" and card["kind"] == "value"


def test_value_training_takes_one_way_of_picking_its_pairs(value_data: Path, tmp_path: Path) -> None:
    from train import value
    from train.common.args import parse_train_args

    argv = ["--config", str(VALUE_CONFIGS[0]), *FAST, "--data", str(value_data), "--output_dir", str(tmp_path),
            "--balance_pairs", "true", "--balance_sources", "true"]  # fmt: skip
    with pytest.raises(UserInputError, match="balance_pairs and balance_sources .* set one of them"):
        value.build_trainer(*parse_train_args(value.make_parser(), argv))
    argv = ["--config", str(VALUE_CONFIGS[0]), *FAST, "--data", str(value_data), "--output_dir", str(tmp_path),
            "--balance_sources", "true", "--max_train_samples", "null"]  # fmt: skip
    with pytest.raises(UserInputError, match="balance_sources shares max_train_samples .* set it too"):
        value.build_trainer(*parse_train_args(value.make_parser(), argv))


def test_lora_on_the_top_layers_leaves_the_lower_layers_frozen_and_out_of_the_backward_pass(
    value_data: Path, tmp_path: Path
) -> None:
    import torch

    from train import value
    from train.common.args import parse_train_args

    argv = ["--config", str(VALUE_CONFIGS[0]), *FAST, "--data", str(value_data), "--output_dir", str(tmp_path),
            "--max_steps", "1", "--eval_strategy", "no", "--per_device_train_batch_size", "2",
            "--max_train_samples", "4", "--lora_top_layers", "1"]  # fmt: skip
    trainer, _ = value.build_trainer(*parse_train_args(value.make_parser(), argv))
    trainer.train()
    trained = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert any(".layers.1." in n for n in trained) and not any(".layers.0." in n for n in trained)
    assert not any("lora_" in n and ".layers.0." in n for n, _ in trainer.model.named_parameters())
    bottom = next(m for n, m in trainer.model.named_modules() if n.endswith("layers.0"))
    needs_grad: list[bool] = []
    bottom.register_forward_hook(lambda _m, _i, out: needs_grad.append(out[0].requires_grad))
    trainer.model(input_ids=torch.tensor([[1, 2, 3]]))
    assert needs_grad == [False]  # nothing below the top layer is kept for, or reached by, the backward pass
    with pytest.raises(UserInputError, match="lora_top_layers 3 is not between 1 and the 2 layers"):
        value.build_trainer(*parse_train_args(value.make_parser(), [*argv, "--lora_top_layers", "3"]))


def test_value_training_refuses_pairs_rendered_with_other_option_texts(value_data: Path, tmp_path: Path) -> None:
    """An adapter's card claims the runtime's value prompt version: the pairs must have been rendered so."""
    import shutil

    from rir_runtime.prompts import prompt_format_version
    from train.value import value_folder

    other = prompt_format_version("value") + 1
    old = tmp_path / "data"
    shutil.copytree(value_data, old)
    record = json.loads((old / "build.json").read_text())
    (old / "build.json").write_text(json.dumps({**record, "value_prompt_version": other}))
    assert value_folder(str(value_data)).name == "value_pref"
    with pytest.raises(UserInputError, match=f"built with value prompts of version {other}, but this runtime renders"):
        value_folder(str(old))


def test_the_latency_bench_scores_whole_decisions_of_a_build(value_data: Path) -> None:
    import importlib.util

    path = Path(__file__).parent.parent / "bench" / "value_latency.py"
    spec = importlib.util.spec_from_file_location("value_latency", path)
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    points = bench.decision_points(str(value_data), 3)
    assert 1 <= len(points) <= 3 and len({p for p, _ in points}) == len(points)
    assert all(p.startswith("Task: ") and len(o) >= 2 for p, o in points)  # a point and the options it names


# --- the language-model head: an option scores the log-probability of its text ---------------------------
def test_the_lm_head_trains_on_each_points_best_option(value_data: Path) -> None:
    from datasets import load_from_disk

    from train.value import best_option_rows

    pairs = load_from_disk(str(value_data / "value_pref"))["train"]
    points = best_option_rows(pairs)
    assert len(points) == len(set(pairs["prompt"])) < len(pairs)
    for point in points:
        values = json.loads(point["meta"]["option_values"])
        ctx = DecisionContext.from_json(point["meta"]["context"])
        best = [None if k == "continue" else int(k) for k, v in values.items() if v == max(values.values())]
        assert point["option"] in [option_text(ctx, option) for option in best]


def test_rir_train_value_with_the_lm_head_serves_option_log_probabilities(value_data: Path, tmp_path: Path) -> None:
    import torch

    from rir_runtime.cli import main as rir
    from rir_runtime.llm.value import LikelihoodScorer, as_chat, load_value_scorer

    out = tmp_path / "value-lm"
    argv = ["train", "value", "--value_head", "lm", "--model", "tiny-random-llama", "--data", str(value_data),
            "--output_dir", str(out), "--max_steps", "2", "--per_device_train_batch_size", "2", "--use_cpu", "true",
            "--bf16", "false", "--lora_target_modules", "q_proj", "v_proj", "--report_to", "none",
            "--save_strategy", "no", "--eval_strategy", "no", "--calibration_rows", "16"]  # fmt: skip
    assert rir(argv) == 0
    card = json.loads((out / "rir_controller.json").read_text())
    assert card["kind"] == "value" and card["value_head"] == "lm" and card["review_threshold"] is not None
    scorer = load_value_scorer(out)
    assert isinstance(scorer, LikelihoodScorer)
    ctx = context()
    prompt, texts = value_prompt(ctx), [o.text for o in recovery_options(ctx, with_continue=True)]
    model, tokenizer = scorer.backend.backend.model, scorer.tokenizer
    head = tokenizer.apply_chat_template(as_chat(prompt), add_generation_prompt=True, tokenize=False)
    expected = []
    for text in texts:  # the whole sequence, one at a time: the sum of the option tokens' log-probabilities
        head_ids = tokenizer(head, add_special_tokens=False)["input_ids"]
        option_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([head_ids + option_ids])).logits[0].float()
        lp = torch.log_softmax(logits[len(head_ids) - 1 : -1], dim=-1)
        expected.append(float(lp[torch.arange(len(option_ids)), torch.tensor(option_ids)].sum()))
    assert scorer.score(prompt, texts) == pytest.approx(expected, abs=1e-3)
    controller = make_controller(f"value:{out}")
    assert isinstance(controller, ValueController) and controller.review(context()).meta["restore"] in range(7)


def test_the_lm_head_takes_no_pair_balancing(value_data: Path, tmp_path: Path) -> None:
    from train import value
    from train.common.args import parse_train_args

    argv = ["--config", str(VALUE_CONFIGS[0]), *FAST, "--data", str(value_data), "--output_dir", str(tmp_path),
            "--value_head", "lm", "--balance_pairs", "true"]  # fmt: skip
    with pytest.raises(UserInputError, match="balance_pairs picks option pairs"):
        value.build_trainer(*parse_train_args(value.make_parser(), argv))
    with pytest.raises(UserInputError, match="value_head 'mlp' invalid"):
        parse_train_args(value.make_parser(), [*argv[:-4], "--value_head", "mlp"])


def test_a_value_model_of_the_where_alone_learns_recoveries_and_leaves_the_when_to_the_rule(
    value_data: Path, tmp_path: Path
) -> None:
    from rir_runtime.cli import main as rir
    from rir_runtime.controllers import HeuristicController
    from train import value
    from train.common.args import parse_train_args

    base = ["--config", str(VALUE_CONFIGS[0]), *FAST, "--data", str(value_data), "--output_dir", str(tmp_path)]
    for head in ("lm", "scalar"):
        argv = [*base, "--value_head", head, "--decision_types", "locate", "--max_train_samples", "null"]
        trainer, card = value.build_trainer(*parse_train_args(value.make_parser(), argv))
        assert card["decision_types"] == ["locate"]
        everything = value.build_trainer(*parse_train_args(value.make_parser(), argv[:-4]))[0].train_dataset
        assert 0 < len(trainer.train_dataset) < len(everything)
    texts = [row["completion"][0]["content"] for row in trainer.train_dataset] if head == "lm" else []
    assert CONTINUE not in texts
    with pytest.raises(UserInputError, match="needs locate"):
        value.build_trainer(*parse_train_args(value.make_parser(), [*base, "--decision_types", "review"]))

    out = tmp_path / "where"
    argv = ["train", "value", "--value_head", "lm", "--decision_types", "locate", "--model", "tiny-random-llama",
            "--data", str(value_data), "--output_dir", str(out), "--max_steps", "1", "--use_cpu", "true",
            "--bf16", "false", "--lora_target_modules", "q_proj", "v_proj", "--report_to", "none",
            "--save_strategy", "no", "--eval_strategy", "no"]  # fmt: skip
    assert rir(argv) == 0
    card = json.loads((out / "rir_controller.json").read_text())
    assert card["decision_types"] == ["locate"] and "review_threshold" not in card  # no When to calibrate
    controller = make_controller(f"value:{out}")
    ctx = context(trigger="schedule")
    assert isinstance(controller, ValueController) and controller.where_only
    assert controller.review(ctx).value == HeuristicController().review(ctx).value
    where = controller.locate_fine(ctx)  # no review of its own picked a point: one pass over the recoveries
    assert where.value in ctx.admissible and where.model_calls == 1


def test_a_build_without_a_point_to_learn_from_says_so(value_data: Path, tmp_path: Path) -> None:
    from datasets import load_from_disk

    from train import value
    from train.common.args import parse_train_args

    pairs = load_from_disk(str(value_data / "value_pref"))
    goes_on = pairs.filter(lambda m: m["chosen_option"] == -1, input_columns="meta")  # no recovery is ever best
    goes_on.save_to_disk(str(tmp_path / "value_pref"))
    argv = ["--config", str(VALUE_CONFIGS[0]), *FAST, "--data", str(tmp_path), "--output_dir", str(tmp_path / "out"),
            "--value_head", "lm", "--decision_types", "locate"]  # fmt: skip
    with pytest.raises(UserInputError, match="no train decision point to learn from with a recovery as its best"):
        value.build_trainer(*parse_train_args(value.make_parser(), argv))
