"""GRPO of the value controller's option policy: `rir train grpo --value_adapter <dir>`.

The value controller decides by scoring the options of a decision ({continue} and {recover to
checkpoint i}) and taking the best. As a policy, it picks option o with probability

    pi(o | point) = softmax(score(o) / temperature)

Each step takes `per_device_train_batch_size` decision points of the build's `value_pref` rows,
samples `num_generations` options per point from pi, and rewards each: online (`--reward online`),
by playing it out from the point's one restored state exactly as the generative form's online
reward does (`train/common/online_rewards.py`: same executor session, same costs); from the table
(`--reward table`), by the option's hindsight value in the row. The group-relative advantage
A = r - mean(r) (over the std too with `scale_rewards: group`) weights the sampled options' log-probs:

    loss = -mean(A * log pi(o))

One update per batch of samples, so GRPO's clipped importance ratio is 1 and drops out; `beta` (a KL
term) is not supported. TRL's `GRPOTrainer` samples text, and these decisions are choices among
scored options, so this is a `transformers.Trainer` (the base of TRL's trainers) whose loss is the
above: the GRPO config's keys, accelerate, checkpoints, resume and logs work as for the other stages.
Options are scored as the controller serves them, so what is trained is what is served: a scalar
head by `rir_runtime.llm.value.option_scores` (one pass over the prompt, the options over its
cache), the language model's own head (`value_head: lm`) by each option text's log-probability after
the chat prompt (`rir_runtime.llm.backends.tail_log_probs`, over the prompt's cache). An adapter trained on the
Where's decisions alone (`decision_types: [locate]`) keeps the rule's When: its points offer the
restores only, as the served Where does. The adapter card says `kind: value` with the start's head
and decisions; a review adapter's margin is calibrated afterwards as for `rir train value`.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from transformers import Trainer

from rir_runtime.branching import Forced
from rir_runtime.cache import write_atomic
from rir_runtime.errors import UserInputError
from train.common.online_rewards import Group, OnlineReward, OnlineRewardLog


@dataclass(frozen=True)
class OptionPoint:
    """One decision point: its prompt, its options (None: go on; i: recover to checkpoint i) and their
    texts, their hindsight values from the build, and where to branch from (`job`, `review_index`)."""

    prompt: str
    options: tuple[int | None, ...]
    texts: tuple[str, ...]
    values: tuple[float, ...]
    job: str
    review_index: int
    source: str = ""  # the rollout folder it came from (meta.source_run)

    @property
    def spread(self) -> float:
        return max(self.values) - min(self.values)

    def forced(self, option: int | None) -> Forced:
        return Forced(False) if option is None else Forced(True, restore_to=option)

    def group(self, indices: Iterable[int]) -> Group:
        """The options at `indices` as one group to play out from this point's restored state."""
        return Group(self.job, self.review_index, tuple(self.forced(self.options[i]) for i in indices))


def option_points(rows: Any, with_continue: bool = True) -> list[OptionPoint]:
    """The distinct decision points of `value_pref` rows (a point's pairs share its prompt, context and
    value table), its options ordered as the controller scores them: going on (unless `with_continue`
    is false: a Where-only adapter chooses among restores), then the latest first."""
    from rir_runtime.controllers.options import option_text
    from rir_runtime.prompts import DecisionContext

    points: dict[tuple[str, int], OptionPoint] = {}
    for prompt, meta in zip(rows["prompt"], rows["meta"], strict=True):
        key = (meta["episode_id"], int(meta["step"]))
        if key in points:
            continue
        ctx = DecisionContext.from_json(meta["context"])
        table = json.loads(meta["option_values"])
        options = (["continue"] if with_continue and "continue" in table else []) + sorted(
            (k for k in table if k != "continue"), key=int
        )[::-1]
        parsed = [None if o == "continue" else int(o) for o in options]
        points[key] = OptionPoint(
            prompt=prompt,
            options=tuple(parsed),
            texts=tuple(option_text(ctx, o) for o in parsed),
            values=tuple(float(table[o]) for o in options),
            job=meta.get("job") or "",
            review_index=int(meta.get("review_index") or 0),
            source=str(meta.get("source_run") or ""),
        )
    return list(points.values())


def load_points(
    script_args: Any, split: str, cap: int | None, seed: int, online: bool, with_continue: bool = True
) -> list[OptionPoint]:
    """The split's decision points with two options or more (where asked, only those whose values
    differ), shuffled and capped (with `balance_sources`, the train cap shared equally by the rollout
    folders, so the workshop's many points do not drown another benchmark's); online, each must name
    its decision point."""
    from data_gen.scoring.answers import share_by_source
    from train.common.data import load_dataset_dict
    from train.value import value_folder

    folder = value_folder(script_args.data)
    splits = load_dataset_dict(folder)
    if split not in splits:
        raise UserInputError(f"{folder} has no '{split}' split (it has {list(splits)}): rebuild it")
    rows = splits[split].select_columns(["prompt", "meta"])
    points = [p for p in option_points(rows, with_continue) if len(p.options) > 1]
    if script_args.spread_only:
        points = [p for p in points if p.spread > 0]
    if online and any(not p.job for p in points):
        raise UserInputError(
            f"{folder} rows name no decision point to branch from (meta.job): rebuild the data with this "
            "version's `rir build-data` for --reward online"
        )
    random.Random(seed).shuffle(points)
    if cap and script_args.balance_sources and split == script_args.train_split:
        points = [points[i] for i in share_by_source([{"source_run": p.source} for p in points], cap)]
    points = points[:cap] if cap else points
    if not points:
        raise UserInputError(f"the '{split}' split of {folder} has no decision point with options to choose from")
    return points


def point_scores(model: Any, tokenizer: Any, point: OptionPoint, lm_head: bool) -> Any:
    """Every option's score as the controller serves it (differentiable where gradients are on)."""
    from rir_runtime.llm import backends
    from rir_runtime.llm.value import as_chat, encode, option_scores, prompt_cache, split_head

    if lm_head:  # the prompt once, the options over its cache, as `LikelihoodScorer` serves them
        prompt_ids = backends.encode_prompt(tokenizer, as_chat(point.prompt))
        kw = backends.cache_keyword(model)
        first_lp, cache = backends.prompt_log_probs_and_cache(model, prompt_ids, kw)
        tails = backends.continuation_tokens(tokenizer, point.texts)
        return backends.tail_log_probs(model, cache, kw, first_lp, len(prompt_ids), tails, tokenizer.pad_token_id)
    body, head = split_head(model)
    encoded = [encode(tokenizer, point.prompt, text) for text in point.texts]
    prompt_ids = encoded[0][0]
    cache = prompt_cache(body, prompt_ids)
    return option_scores(body, head, cache, len(prompt_ids), [ids for _, ids in encoded], tokenizer.pad_token_id)


def missed_points(
    model: Any, tokenizer: Any, points: list[OptionPoint], lm_head: bool, reward: OnlineReward | None
) -> list[OptionPoint]:
    """The points whose served option (the start's best score) earns less than their best option: every
    option played out from the point's restored state as `reward` plays it (once, or the mean of its
    fresh draws), or by the table where `reward` is None.
    Where a trained policy already picks the best, a group's spread only reshuffles near-ties; these
    points are the ones its gradient can fix."""
    import torch
    from tqdm.auto import tqdm

    was_training = model.training
    model.eval()
    with torch.no_grad():
        picks = [int(point_scores(model, tokenizer, p, lm_head).argmax()) for p in tqdm(points, desc="start's picks")]
    model.train(was_training)
    if reward is None:
        values = [p.values for p in points]
    else:
        groups = [p.group(range(len(p.options))) for p in points]
        played = reward.play(groups)
        values = [tuple(played[g]) for g in groups]
    return [p for p, pick, v in zip(points, picks, values, strict=True) if v[pick] < max(v)]


def kept_screen(
    path: Path,
    settings: dict[str, Any],
    points: list[OptionPoint],
    screen: Callable[[list[OptionPoint]], list[OptionPoint]],
) -> list[OptionPoint]:
    """`screen(points)`, its choice kept in `path`: a resumed run (same settings, same candidate points)
    reads it back instead of scoring and playing every point again."""
    candidates = [[p.job, p.review_index] for p in points]
    if path.exists():
        saved = json.loads(path.read_text())
        if saved.get("settings") == settings and saved.get("candidates") == candidates:
            keep = {(job, index) for job, index in saved["points"]}
            return [p for p in points if (p.job, p.review_index) in keep]
    chosen = screen(points)
    kept = {"settings": settings, "candidates": candidates, "points": [[p.job, p.review_index] for p in chosen]}
    write_atomic(path, json.dumps(kept))  # whole or absent: a run killed while writing screens again
    return chosen


def collate_points(points: list[OptionPoint]) -> dict[str, list[OptionPoint]]:
    return {"points": points}


class OptionGRPOTrainer(Trainer):
    """A Trainer whose loss is the option policy's group-relative policy gradient (module docstring)."""

    def __init__(self, *args: Any, reward: OnlineReward | None, lm_head: bool = False, **kwargs: Any) -> None:
        kwargs["data_collator"] = collate_points
        super().__init__(*args, **kwargs)
        self.lm_head = lm_head  # options scored by their text's log-probability, not a scalar head
        self.grpo: Any = self.args  # a GRPOConfig: num_generations, temperature, scale_rewards
        self.tokenizer: Any = self.processing_class
        self.reward = reward  # None: the table's values
        self.metrics: dict[str, dict[str, list[float]]] = {"train": defaultdict(list), "eval": defaultdict(list)}
        self.sampler = random.Random(self.args.seed)

    def _get_train_sampler(self, dataset: Any = None) -> Any:
        """Each point `num_generations` times in a row, as TRL's GRPO samples prompts: a batch of
        `per_device_train_batch_size` samples holds that many over `num_generations` points."""
        from trl.trainer.utils import RepeatSampler

        return RepeatSampler(
            data_source=cast(Any, dataset if dataset is not None else self.train_dataset),
            mini_repeat_count=self.grpo.num_generations,
            batch_size=self.grpo.generation_batch_size // self.grpo.num_generations,
            seed=self.args.seed,
        )

    def _get_eval_sampler(self, eval_dataset: Any) -> Any:
        from trl.trainer.utils import RepeatSampler

        return RepeatSampler(data_source=eval_dataset, mini_repeat_count=self.grpo.num_generations, seed=self.args.seed)

    def scores(self, model: Any, point: OptionPoint) -> Any:
        """Every option's score as the controller serves it, differentiable."""
        return point_scores(self.accelerator.unwrap_model(model), self.tokenizer, point, self.lm_head)

    def log_probs(self, model: Any, point: OptionPoint) -> Any:
        """log pi(o | point) for every option, differentiable."""
        import torch

        return torch.log_softmax(self.scores(model, point) / self.grpo.temperature, dim=-1)

    def sample(self, log_probs: Any) -> list[int]:
        """`num_generations` option indices drawn from pi (seeded: a resumed run draws its own)."""
        weights = log_probs.detach().exp().tolist()
        return self.sampler.choices(range(len(weights)), weights=weights, k=self.grpo.num_generations)

    def rewards(self, points: list[OptionPoint], picks: list[list[int]]) -> list[list[float]]:
        """Each sampled option's reward: played out from its point's restored state, or its table value."""
        if self.reward is None:
            return [[p.values[i] for i in idx] for p, idx in zip(points, picks, strict=True)]
        groups = [p.group(idx) for p, idx in zip(points, picks, strict=True)]
        played = self.reward.play(groups)
        return [played[g] for g in groups]

    def advantages(self, rewards: list[list[float]]) -> list[list[float]]:
        import statistics

        flat = [r for group in rewards for r in group]
        batch_std = statistics.pstdev(flat) if len(flat) > 1 else 0.0
        out = []
        for group in rewards:
            mean = sum(group) / len(group)
            scale = {"group": statistics.pstdev(group), "batch": batch_std}.get(str(self.grpo.scale_rewards), 1.0)
            out.append([(r - mean) / (scale + 1e-4) if scale else r - mean for r in group])
        return out

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch=None):
        import torch

        points: list[OptionPoint] = inputs["points"][:: self.grpo.num_generations]  # each came num_generations times
        mode = "train" if model.training else "eval"
        log_probs = [self.log_probs(model, p) for p in points]
        picks = [self.sample(lp) for lp in log_probs]
        rewards = self.rewards(points, picks)
        advantages = self.advantages(rewards)
        terms = [
            -a * lp[i]
            for lp, idx, adv in zip(log_probs, picks, advantages, strict=True)
            for i, a in zip(idx, adv, strict=True)
        ]
        loss = torch.stack(terms).mean()
        self.record(mode, points, picks, rewards, log_probs)
        return (loss, {}) if return_outputs else loss

    def record(
        self,
        mode: str,
        points: list[OptionPoint],
        picks: list[list[int]],
        rewards: list[list[float]],
        log_probs: list[Any],
    ) -> None:
        """The step's figures for the logs: reward, its spread, how often the policy recovers, and how
        sure it is (the entropy of pi)."""
        flat = [r for group in rewards for r in group]
        m = self.metrics[mode]
        m["reward"].append(sum(flat) / len(flat))
        m["frac_reward_zero_std"].append(sum(max(g) == min(g) for g in rewards) / len(rewards))
        m["recover_share"].append(
            sum(p.options[i] is not None for p, idx in zip(points, picks, strict=True) for i in idx) / len(flat)
        )
        m["entropy"].append(sum(float(-(lp.exp() * lp).sum().detach()) for lp in log_probs) / len(log_probs))
        m["best_in_table"].append(
            sum(p.values[i] == max(p.values) for p, idx in zip(points, picks, strict=True) for i in idx) / len(flat)
        )

    def prediction_step(self, model: Any, inputs: dict[str, Any], prediction_loss_only: bool, ignore_keys=None):
        """Held-out points: the same sampling and rewards, no update (their figures log as eval_*)."""
        import torch

        with torch.no_grad():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "eval" if any(k.startswith("eval_") for k in logs) else "train"
        prefix = "eval_" if mode == "eval" else ""
        for key, values in self.metrics[mode].items():
            if values:
                logs[prefix + key] = round(sum(values) / len(values), 4)
        self.metrics[mode].clear()
        super().log(logs, start_time)


def trainable_value_model(value_adapter: str, model_args: Any, training_args: Any) -> tuple[Any, Any, dict[str, Any]]:
    """(the value adapter on its base model, trainable: a scalar-head model or the causal LM, as its
    card's head says; its tokenizer; its card)."""
    from peft import PeftModel

    from rir_runtime.llm.card import LM, base_model_location, read_card, value_head
    from train.common.models import load_base_model
    from train.value import scalar_head_model, value_tokenizer

    card = read_card(value_adapter, "value")
    base_path = base_model_location(card)
    tokenizer = value_tokenizer(value_adapter)
    if value_head(card) == LM:
        model = load_base_model(base_path, model_args, training_args)
    else:
        model = scalar_head_model(base_path, tokenizer, model_args)
    return (
        PeftModel.from_pretrained(model, value_adapter, is_trainable=True),
        tokenizer,
        {**card, "base_path": base_path},
    )


def check_value_launch(training_args: Any) -> None:
    """What GRPO of a value adapter needs of its launch and arguments: one process, no KL term, the
    prompt's cache on, batches of whole groups."""
    from train.common.distributed import check_launch

    check_launch(training_args)
    if training_args.world_size > 1:
        raise UserInputError(
            "GRPO of a value adapter runs in one process (its option passes call the model's body and head "
            "directly, outside distributed data parallel): launch it on one GPU or the CPU"
        )
    if training_args.beta:
        raise UserInputError("GRPO of a value adapter has no KL term: set --beta 0")
    if training_args.activation_checkpointing:  # GRPOConfig's default; it would turn the model's cache off
        print("note: activation checkpointing off: the options of a point are scored over its prompt's cache")
        training_args.activation_checkpointing = training_args.gradient_checkpointing = False
    generations = training_args.num_generations
    for key in ("per_device_train_batch_size", "per_device_eval_batch_size"):
        if getattr(training_args, key) % generations:
            raise UserInputError(
                f"{key} ({getattr(training_args, key)}) must be a multiple of num_generations ({generations}) for a "
                "value adapter: a batch holds whole groups of one point's sampled options"
            )
    training_args.remove_unused_columns = False


def train_and_eval_points(
    script_args: Any, training_args: Any, with_continue: bool
) -> tuple[list[OptionPoint], list[OptionPoint] | None]:
    """The decision points to train on, and the held-out ones where the run evaluates."""
    from train.common.setup import wants_eval

    online = script_args.reward == "online"

    def points(split: str, cap: int | None) -> list[OptionPoint]:
        return load_points(script_args, split, cap, training_args.seed, online, with_continue)

    held_out = points(script_args.eval_split, script_args.max_eval_samples) if wants_eval(training_args) else None
    return points(script_args.train_split, script_args.max_train_samples), held_out


def hard_points_only(
    script_args: Any,
    out: Path,
    screen: Callable[[list[OptionPoint]], list[OptionPoint]],
    train_points: list[OptionPoint],
    eval_points: list[OptionPoint] | None,
) -> tuple[list[OptionPoint], list[OptionPoint] | None]:
    """`--hard_points`: the points where the start's served option earns less than the best, kept in
    output_dir so a resumed run screens none again."""
    settings = {
        "hard_points": script_args.hard_points,
        "value_adapter": script_args.value_adapter,
        "data": script_args.data,
        "reward_draws": script_args.reward_draws,
    }
    screened = {"train": len(train_points), "eval": len(eval_points or [])}
    train_points = kept_screen(out / "hard_points-train.json", settings, train_points, screen)
    if eval_points:
        eval_points = kept_screen(out / "hard_points-eval.json", settings, eval_points, screen)
    print(
        f"hard points: {len(train_points)} of {screened['train']} train and {len(eval_points or [])} of "
        f"{screened['eval']} held-out decision points, where the start's served option earns less than the best"
    )
    for split, kept, cap in (
        ("train", train_points, "max_train_samples"),
        ("held-out", eval_points, "max_eval_samples"),
    ):
        if kept is not None and not kept:
            raise UserInputError(
                f"no {split} decision point where the start's served option falls short of the best: nothing for "
                f"--hard_points to {'train' if split == 'train' else 'evaluate'} on (set it off, or raise --{cap})"
            )
    return train_points, eval_points


def build_trainer(script_args: Any, training_args: Any, model_args: Any) -> tuple[Any, dict[str, Any]]:
    """(OptionGRPOTrainer on the value adapter, the adapter card's fields)."""
    from rir_runtime.llm.card import LM, value_head
    from train.common.distributed import main_process_first
    from train.common.grpo_common import NoSignalWarning, online_reward, reward_settings
    from train.common.step_phases import OPTION_TIMED, StepPhases
    from train.value import VALUE_DECISIONS, label_values

    check_value_launch(training_args)
    with main_process_first(training_args, "preparing the model and decision points"):
        model, tokenizer, start_card = trainable_value_model(script_args.value_adapter, model_args, training_args)
        decisions = list(start_card.get("decision_types") or VALUE_DECISIONS)
        # a Where-only adapter chooses among restores
        train_points, eval_points = train_and_eval_points(script_args, training_args, "review" in decisions)
    reward = online_reward(script_args)
    lm_head = value_head(start_card) == LM
    if script_args.hard_points != "off":
        judge = reward if script_args.hard_points == "online" else None  # None: the table's values

        def screen(points: list[OptionPoint]) -> list[OptionPoint]:
            return missed_points(model, tokenizer, points, lm_head, judge)

        out = Path(training_args.output_dir)
        train_points, eval_points = hard_points_only(script_args, out, screen, train_points, eval_points)
    phases = StepPhases(OPTION_TIMED)  # scoring (the sampling's pass), rewards and backward seconds in the logs
    trainer = OptionGRPOTrainer(
        model=model,
        args=training_args,
        train_dataset=train_points,
        eval_dataset=eval_points,
        processing_class=tokenizer,
        reward=reward,
        lm_head=lm_head,
        callbacks=[NoSignalWarning(), *([OnlineRewardLog(reward)] if reward else []), phases],
    )
    phases.attach(trainer)
    extra = {
        "value_adapter": script_args.value_adapter,
        "value_head": value_head(start_card),
        "label_values": label_values(script_args.data),
        "rewards": reward_settings(script_args),
        "decision_points": len(train_points),
        "spread_only": script_args.spread_only,
        "hard_points": script_args.hard_points,
    }
    card = dict(
        base_model=start_card["base_model"],
        base_model_path=start_card["base_path"],
        decision_types=decisions,
        fingerprints={},
        stage="grpo",
        kind="value",
        extra=extra,
    )
    return trainer, card
