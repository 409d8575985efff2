"""RolloutBatch row selection and the EOS mask: hand-made tensors, and a loop reference."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from creditflow.rollout import Policy, RolloutBatch, SamplingSettings, completion_mask_from_eos


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
