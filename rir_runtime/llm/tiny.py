"""`tiny-random-llama`: a few-kB Llama with random weights and a byte-level tokenizer.

Why: unit tests (generation, padding, scoring, LoRA training) need a real HF causal LM that
builds offline in a second. Weights are random but deterministic (seeded), so greedy outputs are
reproducible; the tokenizer is byte-level BPE without merges, so any text round-trips.
"""

from __future__ import annotations

from pathlib import Path

import torch

SEED = 0
SPECIAL_TOKENS = ("<pad>", "<|im_start|>", "<|im_end|>")
# ChatML, the format SmolLM2-Instruct uses too, so prompts look the same on tiny and real models.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tokenizer():  # -> PreTrainedTokenizerFast
    """Byte-level BPE over the 256 byte symbols plus ChatML specials (ids 0..2)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for symbol in sorted(pre_tokenizers.ByteLevel.alphabet()):  # a set: unsorted, ids differ per process
        vocab.setdefault(symbol, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<|im_end|>",
        bos_token="<|im_start|>",
        chat_template=CHATML_TEMPLATE,
        model_max_length=2048,
    )


def build_model(vocab_size: int):  # -> LlamaForCausalLM
    """2 layers, hidden 64, 4 query / 2 KV heads (exercises GQA), seeded init.

    A large init range makes logits peaked, so greedy argmax is not decided by float noise: the
    batched-vs-single equality tests must not be flaky.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        initializer_range=0.5,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(SEED)
        model = LlamaForCausalLM(config)
    finally:
        torch.random.set_rng_state(state)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 2
    return model.eval()


def build_tiny(folder: Path) -> dict[str, object]:
    """Write the tiny model + tokenizer into `folder` (an HF checkpoint); returns marker facts."""
    tokenizer = build_tokenizer()
    model = build_model(len(tokenizer))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return {"source": "built from config", "seed": SEED, "vocab_size": len(tokenizer)}
