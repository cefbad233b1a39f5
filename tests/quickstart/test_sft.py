"""SFT warm start: observation tokens carry no loss, and training lowers the loss."""

import pytest
import torch

from sorl_verl.quickstart.sft import collate, masked_lm_loss, tokenize_trajectory, train_sft
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
    assert example.input_ids == list(prompt["input_ids"]) + pieces[0] + pieces[1] + pieces[2] + [tokenizer.eos_token_id]
    expected_mask = [0] * n_prompt + [1] * len(pieces[0]) + [0] * len(pieces[1]) + [1] * len(pieces[2]) + [1]
    assert example.loss_mask == expected_mask
    info_ids = example.input_ids[n_prompt + len(pieces[0]) : n_prompt + len(pieces[0]) + len(pieces[1])]
    assert tokenizer.decode(info_ids) == INFO


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
    losses = train_sft(path, examples, steps=40, batch_size=8, lr=1e-2, warmup_steps=5, out_dir=out, show_progress=False)
    assert len(losses) == 40
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:5]) / 5
    trained = AutoModelForCausalLM.from_pretrained(out)
    initial = AutoModelForCausalLM.from_pretrained(path)
    assert not torch.equal(trained.model.embed_tokens.weight, initial.model.embed_tokens.weight)
    assert (out / "tokenizer.json").is_file()


def test_sft_rejects_empty(tiny):
    path, _, _ = tiny
    with pytest.raises(ValueError, match="no examples"):
        train_sft(path, [], steps=1)
