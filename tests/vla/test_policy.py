import pytest
import torch
import torch.nn.functional as F

from wmrl.domain import RolloutBatch
from wmrl_vla.policy import (
    InstructionTokenizer,
    SmallVLA,
    SmallVLAConfig,
    actions_to_bins,
    bins_to_actions,
)

CFG = SmallVLAConfig(image_size=32, state_dim=5, action_dim=3, n_bins=11, d_model=32, n_layers=1, n_heads=2)


def _obs(b, g=0):
    gen = torch.Generator().manual_seed(g)
    images = torch.randint(0, 256, (b, 3, 32, 32), generator=gen, dtype=torch.uint8)
    states = torch.randn(b, 5, generator=gen)
    instr = InstructionTokenizer(CFG.vocab_size, CFG.max_words).encode(["push the red block"] * b)
    return images, states, instr


def test_tokenizer_pads_and_is_stable():
    tok = InstructionTokenizer(64, 6)
    ids = tok.encode(["Reach the RED target.", "reach the red target"])
    assert ids.shape == (2, 6)
    assert torch.equal(ids[0], ids[1])
    assert (ids[0, :4] > 0).all() and (ids[0, 4:] == 0).all()
    with pytest.raises(ValueError):
        tok.encode([""])
    with pytest.raises(TypeError):
        tok.encode("a string")


def test_bins_round_trip():
    a = torch.tensor([-1.0, -0.5, 0.0, 0.33, 1.0, 3.0])
    b = actions_to_bins(a, 21)
    assert b.tolist() == [0, 5, 10, 13, 20, 20]
    assert torch.allclose(bins_to_actions(b, 21)[:5], torch.tensor([-1.0, -0.5, 0.0, 0.3, 1.0]))


def test_shapes_and_bad_input():
    torch.manual_seed(0)
    m = SmallVLA(CFG)
    images, states, instr = _obs(4)
    assert m(images, states, instr).shape == (4, 3, 11)
    # channels-last frames are accepted
    assert torch.allclose(m(images.permute(0, 2, 3, 1), states, instr), m(images, states, instr))
    with pytest.raises(ValueError, match="images"):
        m(torch.zeros(4, 3, 16, 16, dtype=torch.uint8), states, instr)
    with pytest.raises(ValueError, match="states"):
        m(images, states[:, :2], instr)
    with pytest.raises(ValueError, match="multiple of 16"):
        SmallVLAConfig(image_size=40)


def test_log_probs_match_direct_computation():
    torch.manual_seed(0)
    m = SmallVLA(CFG)
    n, t, a = 3, 4, CFG.action_dim
    images, states, instr = _obs(n * t, g=1)
    images = images.reshape(n, t, 3, 32, 32)
    states = states.reshape(n, t, 5)
    instr = instr[:n]
    tokens = torch.randint(0, CFG.n_bins, (n, t * a))
    mask = torch.ones(n, t * a)
    mask[1, 2 * a :] = 0  # rollout 1 ended after 2 steps
    batch = RolloutBatch(
        tokens=tokens,
        logprobs=torch.zeros(n, t * a),
        mask=mask,
        group_ids=torch.zeros(n, dtype=torch.long),
        tasks=[None],
        extras={"images": images, "states": states, "instr": instr},
    )
    lp = m.log_probs(batch, chunk=5)
    assert lp.shape == (n, t * a)
    assert lp.requires_grad
    # by hand: log_softmax, then gather, one step at a time
    for i in range(n):
        for s in range(t):
            if mask[i, s * a] == 0:
                assert (lp[i, s * a : (s + 1) * a] == 0).all()
                continue
            logits = m(images[i, s : s + 1], states[i, s : s + 1], instr[i : i + 1])[0]  # [A, K]
            ls = logits - torch.logsumexp(logits, -1, keepdim=True)
            for d in range(a):
                expected = ls[d, tokens[i, s * a + d]]
                assert torch.allclose(lp[i, s * a + d], expected, atol=1e-5)
    # gradient flows into the image encoder
    lp.sum().backward()
    assert m.image_enc.convs[0].weight.grad.abs().sum() > 0


def test_act_logprobs_and_temperature():
    torch.manual_seed(0)
    m = SmallVLA(CFG)
    with torch.no_grad():
        m.head.bias.copy_(torch.linspace(0, 3, CFG.n_bins))  # a peaked but not degenerate policy
    images, states, instr = _obs(1)
    images, states, instr = images.expand(2000, -1, -1, -1), states.expand(2000, -1), instr.expand(2000, -1)
    bins, logp, acts = m.act(
        images, states, instr, temperature=1.0, generator=torch.Generator().manual_seed(0)
    )
    assert bins.shape == logp.shape == acts.shape == (2000, 3)
    assert torch.allclose(m.step_log_probs(images[:5], states[:5], instr[:5], bins[:5]), logp[:5], atol=1e-5)
    assert torch.allclose(acts, bins_to_actions(bins, CFG.n_bins))
    greedy, _, _ = m.act(images[:4], states[:4], instr[:4], temperature=0.0)
    argmax = m(images[:1], states[:1], instr[:1]).argmax(-1)
    assert (greedy == argmax).all()
    # lower temperature concentrates samples on the mode; higher spreads them
    counts = {}
    for temp in (0.3, 1.0, 3.0):
        b, _, _ = m.act(images, states, instr, temperature=temp, generator=torch.Generator().manual_seed(1))
        counts[temp] = (b == argmax).float().mean().item()
    assert counts[0.3] > counts[1.0] > counts[3.0]
    # at temperature 1 the empirical frequency of the mode matches its probability
    p_mode = torch.softmax(m(images[:1], states[:1], instr[:1]), -1).max(-1).values.mean().item()
    assert abs(counts[1.0] - p_mode) < 0.04
    with pytest.raises(ValueError):
        m.act(images[:1], states[:1], instr[:1], temperature=-1)


def test_save_load(tmp_path):
    torch.manual_seed(0)
    m = SmallVLA(CFG)
    m.save(tmp_path / "p.pt")
    m2 = SmallVLA.load(tmp_path / "p.pt")
    images, states, instr = _obs(2)
    assert torch.equal(m(images, states, instr), m2(images, states, instr))


def test_locator_matches_the_per_pixel_convolutions():
    """The locator scores each (frame, colour) pair once, as matmuls: the same logits, keypoints and
    gradients as its 1x1 convolutions applied to every pixel (the straightforward form)."""
    torch.manual_seed(0)
    m = SmallVLA(CFG)
    loc = m.locator
    for p in loc.parameters():  # away from the zero-ish init, so every term matters
        p.data.normal_(0, 0.5)
    gen = torch.Generator().manual_seed(3)
    palette = torch.randint(0, 256, (5, 3), generator=gen, dtype=torch.uint8)
    images = palette[torch.randint(0, 5, (4, 32, 32), generator=gen)].permute(0, 3, 1, 2).contiguous()
    images[1] = torch.randint(0, 256, (3, 32, 32), generator=gen, dtype=torch.uint8)  # all distinct
    cond = torch.randn(4, CFG.d_model, generator=gen)

    def reference(images):
        feats = loc.pixels(images.float() / 127.5 - 1.0)  # [B, c, H, W]
        return (feats * loc.query(cond)[:, :, None, None]).sum(1).flatten(1) * loc.log_scale.exp()

    ref = reference(images)
    out = loc(images, cond)
    assert torch.allclose(out["logits"], ref, atol=1e-5)
    assert torch.allclose(loc(images.float(), cond)["logits"], ref, atol=1e-5)  # float input: no dedup
    big = loc(images.repeat(33, 1, 1, 1), cond.repeat(33, 1))["logits"]  # 132 frames: int64 keys
    assert torch.allclose(big, ref.repeat(33, 1), atol=1e-5)
    attn = torch.softmax(ref, -1).view(4, 32, 32)
    kx = (attn.sum(1) * torch.linspace(-1, 1, 32)).sum(-1)
    assert torch.allclose(out["keypoint"][:, 0], kx, atol=1e-5)
    # training sees the same gradients
    w = torch.randn(4, 32 * 32, generator=gen)
    grads = [torch.autograd.grad((f * w).sum(), list(loc.pixels.parameters())) for f in (ref, out["logits"])]
    for a, b in zip(*grads, strict=True):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)


def test_image_encoder_matches_its_straightforward_nchw_form():
    """The FiLM encoder runs its convolutions on channels-last maps and takes the spatial softmax over
    their rows: the same patch and keypoint tokens, and the same gradients, as the plain NCHW form
    (convolutions on contiguous maps, softmax over each channel's flattened map), to float rounding."""
    torch.manual_seed(0)
    enc = SmallVLA(CFG).image_enc
    for p in enc.parameters():  # FiLM's zero init would hide the conditioning
        p.data.normal_(0, 0.1)
    images, _, _ = _obs(6, g=4)
    cond = torch.randn(6, CFG.d_model)

    def reference(images):
        x = images.float() / 127.5 - 1.0
        b, _, h, w = x.shape
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, h), torch.linspace(-1, 1, w), indexing="ij")
        x = torch.cat([x, ys.expand(b, 1, h, w), xs.expand(b, 1, h, w)], 1).contiguous()
        film = enc.film(cond).split([2 * c for c in enc.channels], dim=-1)
        for conv, fb in zip(enc.convs, film, strict=True):
            gamma, beta = fb.chunk(2, dim=-1)
            x = F.gelu(
                F.conv2d(x, conv.weight, conv.bias, conv.stride, conv.padding) * (1 + gamma[..., None, None])
                + beta[..., None, None]
            )
        patches = F.conv2d(x, enc.to_patches.weight, enc.to_patches.bias, 4).flatten(2).transpose(1, 2)
        attn = torch.softmax(x.flatten(2) * enc.log_kp_scale.exp(), -1).view(x.shape)  # [B, C, h, w]
        grid = torch.linspace(-1, 1, x.shape[-1])
        kx, ky = (attn.sum(2) * grid).sum(-1), (attn.sum(3) * grid).sum(-1)
        return patches, enc.keypoints(torch.cat([kx, ky], -1)).unsqueeze(1)

    ref, out = reference(images), enc(images, cond)
    for a, b in zip(ref, out, strict=True):
        assert a.shape == b.shape and a.abs().max() > 0.1  # values of order one: atol means something
        assert torch.allclose(a, b, atol=1e-5)
    w = [torch.randn_like(t) for t in ref]
    params = list(enc.parameters())
    grads = [
        torch.autograd.grad(sum((t * v).sum() for t, v in zip(o, w, strict=True)), params) for o in (ref, out)
    ]
    for a, b in zip(*grads, strict=True):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)


def test_trailing_padding_changes_nothing():
    """The forward pass drops the padding columns after the batch's longest instruction: a row's
    logits do not depend on how long the other instructions are."""
    torch.manual_seed(0)
    m = SmallVLA(CFG).eval()
    images, states, _ = _obs(3, g=4)
    tok = InstructionTokenizer(CFG.vocab_size, CFG.max_words)
    instr = tok.encode(["push the red block", "press", "reach the small green button on the left"])
    with torch.no_grad():
        batch = m(images, states, instr)
        for i in range(3):
            alone = m(images[i : i + 1], states[i : i + 1], instr[i : i + 1])
            assert torch.allclose(batch[i], alone[0], atol=1e-5)
        assert torch.allclose(m(images, states, instr[:, :9]), batch, atol=1e-6)  # 8 words at most


@pytest.mark.parametrize("b", [1, 127, 128, 300])
def test_frame_colours_is_torch_unique_of_the_frame_colour_key(b):
    """The locator's distinct (frame, colour) pairs, taken over blocks of int32 keys, are exactly one
    ``torch.unique`` over the int64 key ``(frame << 24) | colour``: same pairs, same order, same inverse."""
    from wmrl_vla.vision import frame_colours

    gen = torch.Generator().manual_seed(b)
    palette = torch.randint(0, 256, (40, 3), generator=gen, dtype=torch.uint8)
    px = palette[torch.randint(0, 40, (b * 64,), generator=gen)]  # b frames of 8x8 pixels
    frame = torch.arange(b).repeat_interleave(64)
    p = px.long()
    key, inverse = torch.unique(
        (frame << 24) | (p[:, 0] << 16) | (p[:, 1] << 8) | p[:, 2], return_inverse=True
    )
    frames, colours, inv = frame_colours(px, b)
    assert torch.equal(frames, key >> 24)
    assert torch.equal(colours, torch.stack([(key >> 16) & 255, (key >> 8) & 255, key & 255], -1))
    assert torch.equal(inv, inverse)
    assert torch.equal(colours[inv], p) and torch.equal(frames[inv], frame)
