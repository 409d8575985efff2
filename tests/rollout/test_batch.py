"""RolloutBatch row selection and the EOS mask: hand-made tensors, and a loop reference."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from creditflow.rollout import Policy, RolloutBatch, SamplingSettings, completion_mask_from_eos
from creditflow.rollout.batch import concat_batches


def _batch(B: int = 4, P: int = 3, T: int = 5) -> RolloutBatch:
    return RolloutBatch(
        prompt_ids=torch.arange(B * P).view(B, P),
        prompt_mask=torch.ones(B, P, dtype=torch.long),
        completion_ids=100 + torch.arange(B * T).view(B, T),
        completion_mask=torch.ones(B, T),
        old_logp=-torch.arange(B * T, dtype=torch.float32).view(B, T),
        completion_texts=[f"c{i}" for i in range(B)],
        prompt_index=torch.tensor([7, 7, 9, 9]),
        group_size=2,
        entropy=None,
        extras={"pixel_values": torch.arange(B * 2.0).view(B, 2), "image_grid": torch.ones(1, 3)},
    )


def test_select_picks_rows_of_every_per_sequence_field():
    batch = _batch()
    rows = torch.tensor([2, 0])
    sub = batch.select(rows)
    assert sub.batch_size == 2
    for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "old_logp"):
        torch.testing.assert_close(getattr(sub, name), getattr(batch, name)[rows])
    assert sub.completion_texts == ["c2", "c0"]
    torch.testing.assert_close(sub.prompt_index, torch.tensor([9, 7]))
    assert sub.group_size == 2
    assert sub.entropy is None
    # Per-sequence extras follow the rows; extras without a leading B dimension are shared.
    torch.testing.assert_close(sub.extras["pixel_values"], torch.tensor([[4.0, 5.0], [0.0, 1.0]]))
    assert sub.extras["image_grid"] is batch.extras["image_grid"]
    # The original batch is untouched.
    assert batch.batch_size == 4
    assert batch.completion_texts == ["c0", "c1", "c2", "c3"]


def test_select_keeps_entropy_rows():
    batch = _batch()
    batch.entropy = torch.rand(4, 5)
    torch.testing.assert_close(batch.select(torch.tensor([3])).entropy, batch.entropy[3:4])


def test_completion_mask_counts_through_the_first_eos():
    eos = 2
    ids = torch.tensor(
        [
            [5, 2, 7, 2],  # first EOS at t=1: [1, 1, 0, 0]
            [5, 6, 7, 8],  # no EOS: all count
            [2, 0, 0, 0],  # EOS first: only it counts
        ]
    )
    expected = torch.tensor([[1.0, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    torch.testing.assert_close(completion_mask_from_eos(ids, [eos]), expected)


def test_completion_mask_with_several_eos_ids():
    ids = torch.tensor([[5, 3, 2, 9]])  # 3 is the first of {2, 3}: [1, 1, 0, 0]
    torch.testing.assert_close(
        completion_mask_from_eos(ids, [2, 3]), torch.tensor([[1.0, 1, 0, 0]])
    )


@given(
    st.lists(st.lists(st.integers(0, 5), min_size=6, max_size=6), min_size=1, max_size=5),
    st.sets(st.integers(0, 5), min_size=1, max_size=2),
)
def test_completion_mask_matches_a_loop(rows, eos_ids):
    mask = completion_mask_from_eos(torch.tensor(rows), sorted(eos_ids))
    for b, row in enumerate(rows):
        counting = True
        for t, token in enumerate(row):
            assert mask[b, t].item() == (1.0 if counting else 0.0)
            if token in eos_ids:
                counting = False


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"temperature": 0.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
    ],
)
def test_sampling_settings_reject_bad_values(kwargs, key):
    with pytest.raises(ValueError, match=key):
        SamplingSettings(**kwargs)


def test_policy_protocol_is_runtime_checkable():
    class Stub:
        module = torch.nn.Linear(1, 1)
        samples_module = True

        def sample(self, prompts, group_size, with_entropy=False): ...

        def completion_logprobs(self, batch, with_entropy=False): ...

        def weights_updated(self): ...

    assert isinstance(Stub(), Policy)
    assert not isinstance(object(), Policy)


def _part(P: int, T: int, rows: int = 2, start: int = 0) -> RolloutBatch:
    """``rows`` rows whose prompts have P tokens and completions T, left / right padded by 1
    on the first row; ``mm`` is prompt-aligned, ``pixels`` a per-row block of T patches."""
    prompt_mask = torch.ones(rows, P, dtype=torch.long)
    prompt_mask[0, 0] = 0
    completion_mask = torch.ones(rows, T)
    completion_mask[0, -1] = 0
    return RolloutBatch(
        prompt_ids=start + torch.arange(rows * P).view(rows, P),
        prompt_mask=prompt_mask,
        completion_ids=start + 50 + torch.arange(rows * T).view(rows, T),
        completion_mask=completion_mask,
        old_logp=-torch.rand(rows, T),
        completion_texts=[f"{start}-{i}" for i in range(rows)],
        prompt_index=torch.arange(rows) + start,
        group_size=2,
        extras={"mm": torch.full((rows, P), 3), "pixels": torch.ones(rows, T, 2), "shared": 7},
        truncated=torch.tensor([True, False][:rows]),
        pad_id=-1,
        prompt_extras=("mm",),
    )


def test_concat_batches_pads_prompts_left_and_completions_right():
    a, b = _part(P=2, T=4), _part(P=3, T=2, start=100)
    both = concat_batches([a, b])
    assert both.batch_size == 4
    # Prompts: a's rows get one more pad on the left; b's are unchanged.
    assert both.prompt_ids[:2, 1:].tolist() == a.prompt_ids.tolist()
    assert both.prompt_ids[:2, 0].tolist() == [-1, -1]
    assert both.prompt_mask[:2].tolist() == [[0, 0, 1], [0, 1, 1]]
    assert torch.equal(both.prompt_ids[2:], b.prompt_ids)
    assert both.extras["mm"][:2].tolist() == [[0, 3, 3], [0, 3, 3]]  # left, like the prompt
    # Completions: b's rows get two more on the right: ids pad_id, mask and log-probs 0.
    assert torch.equal(both.completion_ids[:2], a.completion_ids)
    assert both.completion_ids[2:, 2:].tolist() == [[-1, -1], [-1, -1]]
    assert both.completion_mask[2:].tolist() == [[1, 0, 0, 0], [1, 1, 0, 0]]
    assert torch.equal(both.old_logp[2:, :2], b.old_logp)
    assert (both.old_logp[2:, 2:] == 0).all()
    assert both.extras["pixels"][2:, 2:].abs().sum() == 0  # per-row blocks padded at the end
    assert both.extras["shared"] == 7
    assert both.completion_texts == ["0-0", "0-1", "100-0", "100-1"]
    assert both.prompt_index.tolist() == [0, 1, 100, 101]
    assert both.truncated.tolist() == [True, False, True, False]
    assert both.entropy is None and both.sampler_logp is None
    # Its rows are the parts' rows again: select then drop the padding.
    back = both.select(torch.tensor([2, 3]))
    assert torch.equal(back.prompt_ids, b.prompt_ids)
    assert torch.equal(back.completion_mask[:, :2], b.completion_mask)


def test_concat_batches_refuses_batches_of_different_setups():
    a, b = _part(P=2, T=4), _part(P=2, T=4)
    b.old_logp = torch.empty(0)
    with pytest.raises(ValueError, match="one policy with one setup"):
        concat_batches([a, b])
