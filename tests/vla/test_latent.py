"""Imagination on the world model's latent (domain.imagine_input=latent, wmrl_vla/latent.py)."""

import pytest
import torch

from wmrl.config import ConfigError, load_config
from wmrl_vla.latent import LatentActor, LatentAdapter, distill, distill_loss, feature_stats
from wmrl_vla.policy import SmallVLA, SmallVLAConfig, pack_visual, unpack_visual
from world_models.vla_dynamics import VLADynamics, VLADynamicsConfig


@pytest.mark.parametrize("locator", [True, False])
def test_the_forward_is_the_trunk_on_the_visual_features(locator):
    torch.manual_seed(0)
    pol = SmallVLA(SmallVLAConfig(image_size=32, d_model=32, n_layers=1, locator=locator)).eval()
    x = torch.randint(0, 256, (5, 3, 32, 32), dtype=torch.uint8)
    s = torch.randn(5, 8)
    instr = pol.tokenizer.encode(["reach the red cube"] * 3 + ["press the button", "push blue"])
    feats = pol.visual_features(x, instr)
    assert feats.shape == (5, pol.feature_dim) == (5, 5 * 32 + (2 if locator else 0))
    assert torch.equal(pol.logits_from_features(feats, s, instr), pol(x, s, instr))
    # and the pixel encoder computed independently, packed by hand
    sentence = pol.sentence(instr)
    patches, kp = pol.image_enc(x, sentence)
    loc = pol.locator(x, sentence)["xy"] if locator else None
    assert torch.equal(feats, pack_visual(patches, kp, loc))
    p2, k2, l2 = unpack_visual(feats, 4, 32, locator)
    assert torch.equal(p2, patches) and torch.equal(k2, kp)
    assert (l2 is None) if not locator else torch.equal(l2, loc)
    # act on features samples from the same logits as act on the frames
    a1 = pol.act(x, s, instr, 1.0, torch.Generator().manual_seed(3))
    a2 = pol.act(None, s, instr, 1.0, torch.Generator().manual_seed(3), features=feats)
    assert all(torch.equal(u, v) for u, v in zip(a1, a2, strict=True))
    with pytest.raises(ValueError, match="features have shape"):
        pol.logits_from_features(feats[:, :-1], s, instr)


def test_distillation_fits_the_change_since_the_first_frame():
    g = torch.Generator().manual_seed(0)
    z, z0 = torch.randn(512, 6, generator=g), torch.randn(512, 6, generator=g)
    sent, f0 = torch.randn(512, 3, generator=g), torch.randn(512, 10, generator=g) * 5
    w = torch.randn(9, 10, generator=g)
    delta = torch.cat([z - z0, sent], 1) @ w * torch.tensor([100.0] * 5 + [0.01] * 5) + 7.0
    targets = f0 + delta  # [N, F]
    mean, std = feature_stats(targets)
    assert torch.allclose(mean, targets.mean(0)) and torch.allclose(std, targets.std(0).clamp(min=1e-3))
    torch.manual_seed(0)
    ad = LatentAdapter(6, 3, 10, hidden=64)
    ad.set_normalisation(targets, f0)
    assert torch.allclose(ad.in_mean, mean) and torch.allclose(ad.in_std, std)
    inputs = (z, z0, f0, sent)
    with torch.no_grad():
        assert torch.equal(ad(*inputs), f0)  # untrained: the first frame's features
    with torch.no_grad():
        before = float(distill_loss(ad, inputs, targets))
    hist = distill(ad, torch.optim.Adam(ad.parameters(), lr=3e-3), inputs, targets, 300, 128, g)
    with torch.no_grad():
        after = float(distill_loss(ad, inputs, targets))
        pred = ad(*inputs)
    assert len(hist) == 300 and after < 0.05 * before
    # the loss is the squared error standardised by the spread of the change, by hand
    d_std = delta.std(0).clamp(min=1e-3)
    assert torch.allclose(torch.tensor(after), (((pred - targets) / d_std) ** 2).mean(), rtol=1e-3)
    with pytest.raises(ValueError, match="z and z0 have shapes"):
        ad(z[:, :5], z0, f0, sent)
    with pytest.raises(ValueError, match="f0 and sentence have shapes"):
        ad(z, z0, f0[:, :9], sent)


def test_the_latent_actor_reads_the_real_first_frame_then_the_adapter():
    torch.manual_seed(0)
    pol = SmallVLA(SmallVLAConfig(image_size=32, d_model=32, n_layers=1)).eval()
    ad = LatentAdapter(16, 32, pol.feature_dim, hidden=32).eval()
    torch.nn.init.normal_(ad.net[-1].weight, std=0.1)  # not the untrained copy of the first frame
    x = torch.randint(0, 256, (3, 3, 32, 32), dtype=torch.uint8)
    s = torch.randn(3, 8)
    instr = pol.tokenizer.encode(["reach the red cube", "press the button", "push blue"])
    z0, z1 = torch.randn(3, 16), torch.randn(3, 16)
    actor = LatentActor(pol, ad, instr, 1.0, torch.Generator().manual_seed(5), first_frames=x)
    a0, a1 = actor(z0, s, 0), actor(z1, s, 1)
    pix = pol.act(x, s, instr, 1.0, torch.Generator().manual_seed(5))
    assert torch.equal(a0, pix[2]) and torch.equal(actor.logprobs[0], pix[1])  # step 0: the real frame
    f1 = ad(z1, z0, pol.visual_features(x, instr), pol.sentence(instr))
    bins, lps, feats = actor.stacked()
    assert bins.shape == (3, 2, 4) and feats.shape == (3, 2, pol.feature_dim)
    assert torch.allclose(feats[:, 1], f1)
    logits = pol.logits_from_features(f1, s, instr)
    lp = torch.log_softmax(logits, -1).gather(-1, bins[:, 1].unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(lps[:, 1], lp) and torch.equal(a1, pol.centers[bins[:, 1]])
    with pytest.raises(ValueError, match="exactly one of first_frames, f0"):
        LatentActor(pol, ad, instr, 1.0)


def test_imagining_on_latents_follows_the_same_latents_without_decoding():
    torch.manual_seed(0)
    wm = VLADynamics(VLADynamicsConfig(image_size=32, latent_dim=16, hidden_dim=32, n_members=2)).eval()
    imgs = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    sts = torch.randn(4, 8)
    acts = torch.rand(6, 4, 4) * 2 - 1
    seen = []

    def on_latent(obs, s, t):
        seen.append(obs.shape)
        return acts[t]

    fr = wm.imagine(imgs, sts, lambda f, s, t: acts[t], 6, success_threshold=2.0)
    la = wm.imagine(imgs, sts, on_latent, 6, success_threshold=2.0, observe="latents")
    assert seen == [(4, 16)] * 6
    for k in ("latents", "states", "actions", "progress", "success", "mask"):
        assert torch.equal(fr[k], la[k]), k
    assert torch.equal(la["images"], imgs.unsqueeze(1).expand(4, 6, 3, 32, 32))
    # the frames the pixel policy saw are those decoded from the latents, one step at a time
    for t in (1, 5):
        assert torch.equal(wm.frames_from_latents(imgs, fr["latents"][:, t]), fr["images"][:, t])
    with pytest.raises(ValueError, match="observe="):
        wm.imagine(imgs, sts, on_latent, 2, observe="pixels")


def test_bad_config_values_raise_clear_errors():
    with pytest.raises(ConfigError, match="imagine_input='latents' is not one of pixels, latent"):
        load_config("vla-debug", ["--domain.imagine_input=latents"])
    with pytest.raises(ConfigError, match="imagine_input=latent needs domain.policy=small_vla"):
        load_config("vla-debug", ["--domain.imagine_input=latent", "--domain.policy=lerobot_act"])
    with pytest.raises(ConfigError, match="latent_adapter_steps=0 must be >= 1"):
        load_config("vla-debug", ["--domain.latent_adapter_steps=0"])


@pytest.fixture(scope="module")
def latent_domain(vla_debug, tmp_path_factory):
    cfg, _, root = vla_debug
    out = tmp_path_factory.mktemp("latent")
    cfg = load_config(
        "vla-debug",
        [f"--out_dir={out / 'run'}", f"--domain.cache_dir={root / 'cache'}", "--domain.imagine_input=latent",
         "--domain.latent_adapter_steps=20", "--domain.latent_refresh_steps=2", "--domain.record_anchors=false"],
    )  # fmt: skip
    domain = cfg.domain.build(cfg)  # the cached demos, SFT policy and WM, a new adapter
    yield cfg, domain
    domain.close()


def test_latent_imagination_through_the_domain(latent_domain):
    _, domain = latent_domain
    m = domain.step_metrics()
    assert 0.0 <= m["latent/heldout_agreement"] <= 1.0 and m["latent/fit_samples"] > 0
    assert 0.0 <= m["latent/heldout_tv"] <= 1.0 and "latent/heldout_tv_first_frame" in m
    tasks = domain.sample_tasks(2, "train", torch.Generator().manual_seed(0))
    before = {k: v.clone() for k, v in domain.latent_adapter.state_dict().items()}
    batch = domain.generate(tasks, 4, torch.tensor([True, False]))
    ex = batch.extras
    n, t = ex["states"].shape[:2]
    assert ex["features"].shape == (n, t, domain.policy.feature_dim)
    assert (
        ex["latent"].tolist() == [p["kind"] == "imagined" for p in batch.payload] == [False] * 4 + [True] * 4
    )
    assert ex["features"][:4].abs().sum() == 0 and ex["features"][4:].abs().sum() > 0
    # the refresh after the imagined batch moved the adapter, and logged its held-out loss
    assert "latent/refresh_loss" in domain.step_metrics()
    assert any(not torch.equal(before[k], v) for k, v in domain.latent_adapter.state_dict().items())
    # log-probs recomputed on the stored features (imagined) and on the frames (simulated) are the
    # sampling ones
    mk = batch.mask > 0
    lp = domain.policy.log_probs(batch)
    assert torch.allclose(lp[mk], batch.logprobs[mk], atol=1e-5)
    # the update on imagined rollouts trains the shared trunk and head, not the pixel encoder
    domain.policy.zero_grad(set_to_none=True)
    imag = batch.select(torch.arange(4, 8))
    (domain.policy.log_probs(imag) * imag.mask).sum().backward()
    assert domain.policy.head.weight.grad.abs().sum() > 0
    assert domain.policy.transformer.layers[0].linear1.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in domain.policy.image_enc.parameters())
    domain.policy.zero_grad(set_to_none=True)
    media = domain.rollout_media(batch, None, torch.zeros(8))
    assert "rollouts/imagined" in media
    # the adapter is part of the domain's checkpoint
    state = domain.state_dict()
    assert "latent_adapter" in state
    domain.load_state_dict(state)


def test_a_training_step_with_latent_imagination_changes_the_policy(latent_domain):
    from wmrl.trainer import Trainer

    cfg, domain = latent_domain
    head = domain.policy.head.weight.detach().clone()
    metrics = Trainer(cfg, domain).train_step()
    assert not torch.equal(head, domain.policy.head.weight.detach())
    assert "domain/latent/refresh_loss" in metrics and "domain/latent/heldout_agreement" in metrics
