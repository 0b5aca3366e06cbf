"""dynapipe.torch: the sampler covers every sample once per epoch and resumes exactly;
collate_microbatch's weights make the accumulated loss the exact token mean."""
import random

import pytest

torch = pytest.importorskip("torch")

import dynapipe  # noqa: E402
from dynapipe.torch import DynamicBatchSampler, collate_microbatch  # noqa: E402


def lengths(n=300, seed=0):
    rng = random.Random(seed)
    return [min(512, int(rng.lognormvariate(4.0, 0.9)) + 2) for _ in range(n)]


def make(rank=0, **kw):
    args = dict(token_budget=4096, num_replicas=2, rank=rank, seed=3, cost_model="analytic:cpu",
                prefetch=1)
    args.update(kw)
    return DynamicBatchSampler(lengths(), **args)


def epoch_steps(sampler):
    return [list(map(list, step)) for step in sampler]


@pytest.mark.parametrize("epoch", [0, 1])
def test_every_sample_once_per_epoch_over_ranks(epoch):
    ranks = [make(rank=r) for r in range(2)]
    for s in ranks:
        s.set_epoch(epoch)
    steps = [epoch_steps(s) for s in ranks]
    assert len(steps[0]) == len(steps[1]) == len(ranks[0]) > 1
    seen = [i for per_rank in steps for step in per_rank for mb in step for i in mb]
    assert sorted(seen) == list(range(300))
    totals = lengths()
    for k, batch in enumerate(ranks[0].global_batches()):
        # both ranks' micro-batches of step k partition global batch k
        got = sorted(i for r in range(2) for mb in steps[r][k] for i in mb)
        assert got == sorted(batch)
        assert sum(totals[i] for i in batch) <= 4096 or len(batch) == 1 or k == len(steps[0]) - 1
        assert all(steps[r][k] for r in range(2))  # every rank works every step


def test_epochs_shuffle_differently_and_reproducibly():
    a, b = make(), make()
    b.set_epoch(1)
    assert a.global_batches() != b.global_batches()
    assert make().global_batches() == a.global_batches()
    ordered = make(shuffle=False)
    assert [i for batch in ordered.global_batches() for i in batch] == list(range(300))


def test_drop_last_leaves_out_only_the_last_batch():
    full, dropped = make(shuffle=False, num_replicas=1), make(shuffle=False, num_replicas=1, drop_last=True)
    assert dropped.global_batches() == full.global_batches()[:-1]
    seen = sorted(i for step in dropped for mb in step for i in mb)
    assert seen == sorted(i for b in full.global_batches()[:-1] for i in b)


def test_resume_yields_exactly_the_remaining_steps():
    ref = make()
    ref.set_epoch(2)
    expected = epoch_steps(ref)
    first = make()
    first.set_epoch(2)
    it = iter(first)
    head = [list(map(list, next(it))) for _ in range(3)]
    state = first.state_dict()
    assert state["epoch"] == 2 and state["step"] == 3
    resumed = make()
    resumed.load_state_dict(state)
    resumed.set_epoch(2)  # a training loop calls this again after loading
    assert head + epoch_steps(resumed) == expected
    # the next epoch starts from its first step
    resumed.set_epoch(3)
    ref.set_epoch(3)
    assert epoch_steps(resumed) == epoch_steps(ref)


def test_state_from_another_configuration_is_refused():
    with pytest.raises(dynapipe.InvalidArgument, match="token_budget must match"):
        make(token_budget=8192).load_state_dict(make().state_dict())


def test_step_loss_tokens_and_dp_microbatches():
    s = make(num_replicas=1)
    totals = lengths()
    for step in s:
        samples = [i for mb in step for i in mb]
        assert step.loss_tokens == sum(totals[i] - 1 for i in samples)
        # the micro-batches are the planner's DP choice for this batch
        plan = dynapipe.Planner(pp=1, dp=1, global_batch_tokens=4096, seed=3, cost_model="analytic:cpu",
                                strategy="dynapipe-padded",
                                max_seqlen=max(totals)).plan(
            [totals[i] for i in s.global_batches()[step.index]], ids=s.global_batches()[step.index])
        assert [list(mb.sample_ids) for mb in plan.microbatches] == list(map(list, step))


def test_bad_arguments_name_themselves():
    with pytest.raises(dynapipe.InvalidArgument, match=r"lengths\[1\] must be >= 1, got -3"):
        DynamicBatchSampler([5, -3], token_budget=100)
    with pytest.raises(dynapipe.InvalidType, match=r"lengths\[0\] must be an integer, got float"):
        DynamicBatchSampler([5.5], token_budget=100)
    with pytest.raises(dynapipe.InvalidArgument, match="token_budget must be an integer >= 1"):
        DynamicBatchSampler([5], token_budget=0)
    with pytest.raises(dynapipe.InvalidArgument, match=r"rank must be an integer in \[0, 2\), got 2"):
        DynamicBatchSampler([5, 6], token_budget=100, num_replicas=2, rank=2)
    with pytest.raises(dynapipe.NotFound, match="gpt-7b"):
        DynamicBatchSampler([5], token_budget=100, model="gpt-7b")


# -- collate ----------------------------------------------------------------------------

def token_losses(model, batch):
    logits = model(batch["input_ids"])
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(),
                                             ignore_index=-100)


@pytest.mark.parametrize("pack", [False, True])
@pytest.mark.parametrize("pairs", [False, True])
def test_weighted_microbatch_losses_sum_to_the_step_token_mean(pack, pairs):
    torch.manual_seed(0)
    rng = random.Random(1)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 50)).double()
    if pairs:
        samples = [(torch.randint(0, 50, (rng.randint(1, 9),)), torch.randint(0, 50, (rng.randint(1, 5),)))
                   for _ in range(13)]
        step_tokens = sum(t.numel() for _, t in samples)
    else:
        samples = [torch.randint(0, 50, (rng.randint(2, 20),)) for _ in range(13)]
        step_tokens = sum(s.numel() - 1 for s in samples)
    whole = collate_microbatch(samples, step_loss_tokens=step_tokens)
    assert whole["loss_tokens"] == step_tokens and whole["loss_weight"] == 1.0
    reference = token_losses(model, whole)
    cuts = [0, 2, 3, 9, 13]
    split = sum(token_losses(model, mb) * mb["loss_weight"]
                for mb in (collate_microbatch(samples[a:b], step_loss_tokens=step_tokens, pack=pack)
                           for a, b in zip(cuts, cuts[1:])))
    assert split.item() == pytest.approx(reference.item(), rel=1e-12)


def test_collate_layouts():
    seqs = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    pad = collate_microbatch(seqs, step_loss_tokens=6, world_size=2, pad_id=0)
    assert pad["input_ids"].tolist() == [[1, 2, 3, 0], [4, 5, 0, 0], [6, 7, 8, 9]]
    assert pad["labels"].tolist() == [[2, 3, -100, -100], [5, -100, -100, -100], [7, 8, 9, -100]]
    assert pad["loss_tokens"] == 6 and pad["loss_weight"] == 2.0
    packed = collate_microbatch(seqs, step_loss_tokens=12, pack=True)
    assert packed["input_ids"].tolist() == [[1, 2, 3, 4, 5, 6, 7, 8, 9]]
    assert packed["labels"].tolist() == [[2, 3, -100, 5, -100, 7, 8, 9, -100]]
    assert packed["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 2, 3]]
    assert packed["cu_seqlens"].tolist() == [0, 3, 5, 9] and packed["loss_weight"] == 0.5
    pair = collate_microbatch([([1, 2], [3, 4, 5])], step_loss_tokens=3)
    assert pair["labels"].tolist() == [[-100, 3, 4, 5, -100]]
    with pytest.raises(dynapipe.InvalidArgument, match="step_loss_tokens must be an integer >= 1"):
        collate_microbatch(seqs, step_loss_tokens=0)
    with pytest.raises(dynapipe.InvalidArgument, match="sample 1: a sequence needs >= 2 tokens"):
        collate_microbatch([[1, 2], [3]], step_loss_tokens=1)
