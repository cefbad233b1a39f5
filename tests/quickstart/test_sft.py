"""SFT warm start: observation tokens carry no loss, and training lowers the loss."""

import pytest
import torch

from sorl_verl.quickstart.sft import (
    collate,
    load_causal_lm,
    masked_lm_loss,
    tokenize_trajectory,
    train_sft,
)
from sorl_verl.quickstart.task import SEARCH_R1_TAGS, demonstration, generate_facts, prompt_messages

INFO = '\n\n<information>Doc 1(Title: "Vobipos") Vobipos is a small country. Its capital is Nide.\n</information>\n\n'


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoTokenizer

    from sorl_verl.models.tiny import build_tiny_model

    facts = generate_facts({"sft": 24, "train": 1, "val": 1}, seed=0)
    texts = [f.document_text for f in facts] + [f.question for f in facts] + [INFO]
    path = build_tiny_model(
        tmp_path_factory.mktemp("tiny") / "model",
        texts=texts,
        vocab_size=400,
        hidden_size=32,
        num_layers=1,
        extra_tokens=SEARCH_R1_TAGS,
    )
    return path, AutoTokenizer.from_pretrained(path), facts


def test_information_tokens_are_masked_and_everything_else_of_the_response_trained(tiny):
    _, tokenizer, facts = tiny
    fact = facts[0]
    segments = demonstration(fact, INFO)
    example = tokenize_trajectory(tokenizer, prompt_messages(fact.question), segments)
    prompt = tokenizer.apply_chat_template(prompt_messages(fact.question), add_generation_prompt=True, tokenize=True)
    n_prompt = len(prompt["input_ids"])
    pieces = [tokenizer.encode(text, add_special_tokens=False) for text, _ in segments]
    assert example.input_ids == list(prompt["input_ids"]) + [t for p in pieces for t in p] + [tokenizer.eos_token_id]
    expected_mask = (
        [0] * n_prompt
        + [m for p, (_, trainable) in zip(pieces, segments, strict=True) for m in [int(trainable)] * len(p)]
        + [1]
    )
    assert example.loss_mask == expected_mask
    start = n_prompt + sum(len(p) for p in pieces[:3])
    assert tokenizer.decode(example.input_ids[start : start + len(pieces[3])]) == INFO
    # the model's own text, cut at the tags into segments, gives the tokens of the whole text:
    # what the model generates in one piece is what SFT trained on
    own = segments[0][0] + segments[1][0] + segments[2][0]
    assert pieces[0] + pieces[1] + pieces[2] == tokenizer.encode(own, add_special_tokens=False)


def test_untaught_choice_masks_only_the_search_tag(tiny):
    _, tokenizer, facts = tiny
    taught = tokenize_trajectory(tokenizer, prompt_messages(facts[0].question), demonstration(facts[0], INFO))
    untaught = tokenize_trajectory(
        tokenizer, prompt_messages(facts[0].question), demonstration(facts[0], INFO, teach_choice=False)
    )
    assert untaught.input_ids == taught.input_ids
    diff = [i for i, (a, b) in enumerate(zip(taught.loss_mask, untaught.loss_mask, strict=True)) if a != b]
    assert len(diff) == 1 and tokenizer.convert_ids_to_tokens(taught.input_ids[diff[0]]) == "<search>"


def test_observation_is_cut_like_the_agent_loop(tiny):
    _, tokenizer, facts = tiny
    segments = demonstration(facts[0], INFO)
    full = tokenize_trajectory(tokenizer, prompt_messages(facts[0].question), segments)
    cut = tokenize_trajectory(tokenizer, prompt_messages(facts[0].question), segments, max_observation_tokens=5)
    n_info = len(tokenizer.encode(INFO, add_special_tokens=False))
    assert len(full.input_ids) - len(cut.input_ids) == n_info - 5
    assert sum(cut.loss_mask) == sum(full.loss_mask)


def test_masked_loss_ignores_masked_targets():
    torch.manual_seed(0)
    logits = torch.randn(2, 6, 11)
    input_ids = torch.randint(11, (2, 6))
    loss_mask = torch.tensor([[0, 0, 1, 1, 0, 1], [0, 1, 0, 0, 0, 0]], dtype=torch.float32)
    base = masked_lm_loss(logits, input_ids, loss_mask)
    changed = logits.clone()
    # target position j is predicted by logits[:, j - 1]: positions 3 (row 0) and 3 (row 1) are masked targets
    changed[0, 3] += 100 * torch.randn(11)
    changed[1, 3] += 100 * torch.randn(11)
    assert torch.allclose(masked_lm_loss(changed, input_ids, loss_mask), base)
    changed[0, 1] += 100 * torch.randn(11)  # predicts target 2, which is trained
    assert not torch.allclose(masked_lm_loss(changed, input_ids, loss_mask), base)
    manual = torch.nn.functional.cross_entropy(logits[0, 1], input_ids[0, 2])
    only_one = torch.zeros_like(loss_mask)
    only_one[0, 2] = 1
    assert torch.allclose(masked_lm_loss(logits, input_ids, only_one), manual)
    assert masked_lm_loss(logits, input_ids, torch.zeros_like(loss_mask)).item() == 0.0


def test_collate_right_pads():
    from sorl_verl.quickstart.sft import SFTExample

    batch = collate([SFTExample([5, 6, 7], [0, 1, 1]), SFTExample([8], [1])], pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["loss_mask"].tolist() == [[0, 1, 1], [1, 0, 0]]


def test_sft_lowers_the_loss_and_saves_a_loadable_model(tiny, tmp_path):
    from transformers import AutoModelForCausalLM

    path, tokenizer, facts = tiny
    examples = [tokenize_trajectory(tokenizer, prompt_messages(f.question), demonstration(f, INFO)) for f in facts]
    out = tmp_path / "sft"
    losses = train_sft(
        path,
        examples,
        steps=40,
        batch_size=8,
        lr=1e-2,
        warmup_steps=5,
        out_dir=out,
        show_progress=False,
        attention="sdpa",
    )
    assert len(losses) == 40
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:5]) / 5
    trained = AutoModelForCausalLM.from_pretrained(out)
    initial = AutoModelForCausalLM.from_pretrained(path)
    assert not torch.equal(trained.model.embed_tokens.weight, initial.model.embed_tokens.weight)
    assert (out / "tokenizer.json").is_file()
    # SFT's attention kernel is not pinned in the checkpoint: RL loads it with its own
    assert "sdpa" not in (out / "config.json").read_text()


def test_sft_attention_computes_what_the_rl_sides_eager_attention_computes(tiny):
    # SFT trains with sdpa, RL (sorl_verl.platform) computes with eager attention: on a right-padded
    # batch their logits must agree at every real position.
    from transformers import AutoModelForCausalLM

    path, tokenizer, facts = tiny
    examples = [tokenize_trajectory(tokenizer, prompt_messages(f.question), demonstration(f, INFO)) for f in facts[:6]]
    examples[0].input_ids, examples[0].loss_mask = examples[0].input_ids[:9], examples[0].loss_mask[:9]
    batch = collate(examples, pad_id=0)
    torch.manual_seed(0)
    fused = load_causal_lm(path, "sdpa").eval()
    eager = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        for p in fused.parameters():  # the built model's init is small: make attention matter
            p.add_(0.5 * torch.randn_like(p))
        eager.load_state_dict(fused.state_dict())
        kwargs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        a, b = fused(**kwargs).logits, eager(**kwargs).logits
    real = batch["attention_mask"].bool()
    assert a.shape == b.shape and real.sum() < real.numel()
    torch.testing.assert_close(a[real], b[real], rtol=1e-4, atol=1e-4)
    assert a[real].std() > 0.1  # logits that differ between tokens, not a constant both agree on


def test_sft_refuses_an_unknown_attention(tiny):
    path, _, _ = tiny
    with pytest.raises(ValueError, match="SFT attention 'flash': choose from eager, sdpa"):
        load_causal_lm(path, "flash")


def test_sft_rejects_empty(tiny):
    path, _, _ = tiny
    with pytest.raises(ValueError, match="no examples"):
        train_sft(path, [], steps=1)


class _NextTokenOracle(torch.nn.Module):
    """Predicts ``(token + 1) % vocab`` after every token: right exactly where a sequence counts up."""

    def __init__(self, vocab: int = 16):
        super().__init__()
        self.vocab = vocab

    def forward(self, input_ids, attention_mask):
        from types import SimpleNamespace

        return SimpleNamespace(logits=torch.nn.functional.one_hot((input_ids + 1) % self.vocab, self.vocab).float())


def test_teacher_forced_exact_checks_every_trainable_target_but_the_ignored_ones():
    from sorl_verl.quickstart.sft import SFTExample, teacher_forced_exact

    oracle = _NextTokenOracle()
    right = SFTExample([1, 2, 3, 4, 5], [0, 1, 1, 1, 1])
    wrong_trainable = SFTExample([1, 2, 9, 4, 5], [0, 1, 1, 1, 1])  # 9 follows 2: mispredicted, checked
    wrong_masked = SFTExample([1, 2, 9, 10, 11], [0, 0, 0, 1, 1])  # the break is at a masked target
    wrong_ignored = SFTExample([1, 2, 7, 8, 9], [0, 1, 1, 1, 1])  # the break's target (7) is ignored
    assert teacher_forced_exact(oracle, [right], pad_id=0) == 1.0
    assert teacher_forced_exact(oracle, [wrong_trainable], pad_id=0) == 0.0
    assert teacher_forced_exact(oracle, [wrong_masked], pad_id=0) == 1.0
    assert teacher_forced_exact(oracle, [wrong_ignored], pad_id=0) == 0.0
    assert teacher_forced_exact(oracle, [wrong_ignored], pad_id=0, ignore_targets=[7]) == 1.0
    # padding of shorter rows in a batch is never checked; batches split anywhere give the same share
    mixed = [right, wrong_trainable, SFTExample([3, 4], [0, 1]), wrong_masked]
    assert teacher_forced_exact(oracle, mixed, pad_id=0) == 0.75
    assert teacher_forced_exact(oracle, mixed, pad_id=0, batch_size=3) == 0.75
