#!/usr/bin/python3
"""Self-consistency tests of the PyTorch oracle (torch_model.py, run_oracle.py).

Checks the parameter contract, the forward pass (with MoE layers: also the routing counts and the
auxiliary loss) against a loop-by-loop numpy reference written from the model description,
grouped-query attention against plain multi-head attention, autograd of the training objective
against finite differences (float64), causality, RoPE's relative-position property, the learning
rate schedule, AdamW, clipping and the MoE bias rule against their formulas, and the oracle CLI
end to end. The MoE layer's own tests (moe_selftest.py) and those of the Hugging Face format
oracle (hf_selftest.py) run as part of this suite; the helpers shared with them are in
oracle_testutil.py.
"""

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_selftest  # noqa: E402
import make_example_input  # noqa: E402
import moe_selftest  # noqa: E402
import run_oracle  # noqa: E402
import torch_model  # noqa: E402
from oracle_testutil import (  # noqa: E402
    CONFIGS, expected_contract, manual_training, params_numpy, random_model, random_tokens,
    reference_forward, small_cfg)

torch.set_num_threads(1)


def load_tests(loader, tests, pattern):
    """unittest's hook: the MoE tests (moe_selftest.py) and the Hugging Face format oracle's
    tests (hf_selftest.py) run as part of this suite."""
    tests.addTests(loader.loadTestsFromModule(moe_selftest))
    tests.addTests(loader.loadTestsFromModule(hf_selftest))
    return tests



def central_difference(model, tokens, targets, flat, i, h):
    """(objective(x_i + h) - objective(x_i - h)) / 2h for element i of a parameter's flat view."""
    old = flat[i].item()
    with torch.no_grad():
        flat[i] = old + h
        up = model.objective(tokens, targets).objective.item()
        flat[i] = old - h
        down = model.objective(tokens, targets).objective.item()
        flat[i] = old
    return (up - down) / (2 * h)

class ContractTest(unittest.TestCase):
    def test_names_shapes_and_order(self):
        for label, cfg in CONFIGS.items():
            with self.subTest(label):
                model = torch_model.build_model(cfg)
                got = [(n, tuple(p.shape)) for n, p in model.named_contract_parameters()]
                self.assertEqual(got, expected_contract(cfg))
                # Every trainable tensor of the module is in the contract, exactly once; the
                # contract's other tensors are the MoE selection biases, which are buffers.
                contract_ids = [id(p) for _, p in model.named_contract_parameters()]
                self.assertEqual(len(set(contract_ids)), len(contract_ids))
                trained = model.named_trainable_parameters()
                self.assertEqual({id(p) for _, p in trained}, {id(p) for p in model.parameters()})
                untrained = [n for n, _ in model.named_contract_parameters()
                             if n not in dict(trained)]
                self.assertEqual(untrained, [n for n, _ in expected_contract(cfg)
                                             if n.endswith(".moe.router.bias")])
                self.assertEqual({id(p) for p in model.buffers()},
                                 {id(p) for n, p in model.named_contract_parameters()
                                  if n in untrained})

    def test_preset_parameter_counts(self):
        # The engine's presets gpt2-124m and llama-debug, counted from the contract.
        gpt2_124m = {"family": "gpt2", "layers": 12, "width": 768, "heads": 12, "vocab": 50257,
                     "max_seq": 1024}
        self.assertEqual(sum(math.prod(s) for _, s in expected_contract(gpt2_124m)), 124439808)
        llama_debug = {"family": "llama", "layers": 2, "width": 64, "heads": 4, "kv_heads": 2,
                       "ffn_hidden": 128, "vocab": 256, "max_seq": 64}
        model = torch_model.build_model(llama_debug)
        self.assertEqual(torch_model.parameter_count(model),
                         2 * 256 * 64 + 64 + 2 * (64 + 128 * 64 + 64 * 64 + 64 + 256 * 64 + 64 * 128))

    def test_config_validation(self):
        bad = [
            ({"heads": 3}, "heads"), ({"kv_heads": 3}, "kv_heads"), ({"family": "bert"}, "family"),
            ({"layers": 0}, "layers"), ({"norm_eps": 0}, "norm_eps"), ({"vocab": 1}, "vocab"),
            ({"tied_embeddings": 1}, "tied_embeddings"),
        ]
        for change, key in bad:
            with self.subTest(change):
                cfg = small_cfg("llama")
                cfg.update(change)
                with self.assertRaisesRegex(torch_model.ConfigError, key):
                    torch_model.normalize_config(cfg)
        odd_head = small_cfg("llama", width=12, heads=4, kv_heads=2)  # head_dim 3
        with self.assertRaisesRegex(torch_model.ConfigError, "even head dimension"):
            torch_model.normalize_config(odd_head)
        filled = torch_model.normalize_config({"family": "gpt2", "layers": 1, "width": 8,
                                               "heads": 2, "vocab": 5, "max_seq": 4})
        self.assertEqual((filled["kv_heads"], filled["ffn_hidden"], filled["tied_embeddings"]),
                         (2, 32, True))


class ForwardTest(unittest.TestCase):
    def test_matches_loop_reference(self):
        for label, cfg in CONFIGS.items():
            with self.subTest(label):
                model = random_model(cfg, seed=1)
                tokens = random_tokens(cfg, 2, cfg["seq_len"], seed=2)
                targets = random_tokens(cfg, 2, cfg["seq_len"], seed=3)
                with torch.no_grad():
                    got = model.objective(tokens, targets)
                want, want_aux, want_routing = reference_forward(cfg, params_numpy(model),
                                                                 tokens.numpy())
                np.testing.assert_allclose(got.logits.numpy(), want, rtol=1e-10, atol=1e-10)
                self.assertAlmostEqual(got.aux_loss.item(), want_aux, delta=1e-12)
                self.assertEqual([(r.layer, r.counts.tolist(), r.dropped) for r in got.routing],
                                 want_routing)
                if "moe" in cfg and cfg["moe"]["balance"] == "aux_loss":
                    self.assertGreater(want_aux, 0.0)

    def test_gqa_with_kv_equal_heads_is_plain_mha(self):
        # Plain multi-head attention written directly with per-head q/k/v blocks, no grouping.
        cfg = CONFIGS["llama_mha"]
        model = random_model(cfg, seed=3)
        x = torch.randn(2, 6, cfg["width"], dtype=torch.float64,
                        generator=torch.Generator().manual_seed(4))
        attn = model.h[0].attn
        H, D, T = cfg["heads"], cfg["width"] // cfg["heads"], x.shape[1]
        qkv = x @ attn.qkv.weight.T
        q, k, v = qkv.split(H * D, dim=-1)
        cos, sin = torch_model.rope_cos_sin(T, D, cfg["rope_theta"], torch.float64)
        q = torch_model.apply_rope(q.view(2, T, H, D), cos, sin)
        k = torch_model.apply_rope(k.view(2, T, H, D), cos, sin)
        v = v.view(2, T, H, D)
        heads = []
        for h in range(H):
            s = q[:, :, h] @ k[:, :, h].transpose(1, 2) / math.sqrt(D)
            s = s + torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
            heads.append(torch.softmax(s, -1) @ v[:, :, h])
        want = torch.cat(heads, -1) @ attn.proj.weight.T
        with torch.no_grad():
            torch.testing.assert_close(attn(x), want, rtol=1e-12, atol=1e-12)

    def test_gqa_equals_mha_with_replicated_kv_heads(self):
        for kv in (1, 2):
            with self.subTest(kv_heads=kv):
                gqa_cfg = small_cfg("llama", kv_heads=kv)
                mha_cfg = small_cfg("llama", kv_heads=gqa_cfg["heads"])
                gqa = random_model(gqa_cfg, seed=5)
                mha = torch_model.build_model(mha_cfg).double()
                H, D = gqa_cfg["heads"], gqa_cfg["width"] // gqa_cfg["heads"]
                rep = H // kv
                src = dict(gqa.named_contract_parameters())
                with torch.no_grad():
                    for name, p in mha.named_contract_parameters():
                        if not name.endswith("attn.qkv.w"):
                            p.copy_(src[name])
                            continue
                        w = src[name]
                        q, k, v = w[:H * D], w[H * D:(H + kv) * D], w[(H + kv) * D:]
                        k = k.view(kv, D, -1).repeat_interleave(rep, 0).reshape(H * D, -1)
                        v = v.view(kv, D, -1).repeat_interleave(rep, 0).reshape(H * D, -1)
                        p.copy_(torch.cat([q, k, v]))
                tokens = random_tokens(gqa_cfg, 2, 7, seed=6)
                with torch.no_grad():
                    torch.testing.assert_close(gqa(tokens), mha(tokens), rtol=1e-12, atol=1e-12)

    def test_causal(self):
        for label in ("gpt2_tied", "llama_gqa"):
            with self.subTest(label):
                cfg = CONFIGS[label]
                model = random_model(cfg, seed=7)
                tokens = random_tokens(cfg, 1, 8, seed=8)
                changed = tokens.clone()
                changed[0, 5] = (changed[0, 5] + 1) % cfg["vocab"]
                with torch.no_grad():
                    a, b = model(tokens), model(changed)
                torch.testing.assert_close(a[:, :5], b[:, :5], rtol=0, atol=0)
                self.assertGreater((a[:, 5:] - b[:, 5:]).abs().max().item(), 1e-6)

    def test_rope_scores_depend_on_relative_position_only(self):
        D, T = 8, 10
        gen = torch.Generator().manual_seed(9)
        q = torch.randn(D, dtype=torch.float64, generator=gen)
        k = torch.randn(D, dtype=torch.float64, generator=gen)
        cos, sin = torch_model.rope_cos_sin(T, D, 10000.0, torch.float64)
        qs = torch_model.apply_rope(q.expand(1, T, 1, D), cos, sin)[0, :, 0]
        ks = torch_model.apply_rope(k.expand(1, T, 1, D), cos, sin)[0, :, 0]
        torch.testing.assert_close(qs[0], q, rtol=0, atol=0)  # position 0 is the identity
        scores = qs @ ks.T
        for offset in range(-3, 4):
            diag = torch.diagonal(scores, offset)
            torch.testing.assert_close(diag, diag[0].expand_as(diag), rtol=1e-12, atol=1e-12)
        # The rotation preserves norms.
        torch.testing.assert_close(qs.norm(dim=-1), q.norm().expand(T), rtol=1e-12, atol=0)


class GemmaScalingTest(unittest.TestCase):
    """attention_scale_dim, attention_softcap and logit_softcap (Gemma 2's query_pre_attn_scalar,
    attn_logit_softcapping and final_logit_softcapping)."""

    def logits(self, **keys):
        cfg = small_cfg("llama", head_dim=6, **keys)  # width 16, 4 heads of 6
        model = random_model(cfg, seed=20)
        with torch.no_grad():
            return model(random_tokens(cfg, 2, 7, seed=21))

    def test_attention_scale_dim(self):
        base = self.logits()
        torch.testing.assert_close(self.logits(attention_scale_dim=6), base, rtol=0, atol=0)
        self.assertGreater((self.logits(attention_scale_dim=10) - base).abs().max().item(), 1e-3)

    def test_softcaps(self):
        base = self.logits()
        for key, small in (("attention_softcap", 0.5), ("logit_softcap", 2.0)):
            with self.subTest(key):
                torch.testing.assert_close(self.logits(**{key: 1e6}), base, rtol=0, atol=1e-5)
                capped = self.logits(**{key: small})
                self.assertGreater((capped - base).abs().max().item(), 1e-3)
        self.assertGreater(base.abs().max().item(), 2.5)
        self.assertLessEqual(self.logits(logit_softcap=2.0).abs().max().item(), 2.0)

    def test_capped_attention_matches_formula(self):
        # One block's attention written out: scores times 10^-0.5, capped 0.5 tanh(s / 0.5), then
        # the causal mask; gpt2 (no RoPE) so nothing else comes between.
        cfg = small_cfg("gpt2", attention_scale_dim=10, attention_softcap=0.5)
        attn = random_model(cfg, seed=22).h[0].attn
        x = torch.randn(2, 5, cfg["width"], dtype=torch.float64,
                        generator=torch.Generator().manual_seed(23))
        H, D, T = cfg["heads"], cfg["width"] // cfg["heads"], x.shape[1]
        q, k, v = (t.view(2, T, H, D).transpose(1, 2)
                   for t in attn.qkv(x).split(H * D, dim=-1))
        s = 0.5 * torch.tanh(q @ k.transpose(-1, -2) / math.sqrt(10) / 0.5)
        s = s + torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
        want = attn.proj((torch.softmax(s, -1) @ v).transpose(1, 2).reshape(2, T, H * D))
        with torch.no_grad():
            torch.testing.assert_close(attn(x), want, rtol=1e-12, atol=1e-12)

    def test_gradients_through_caps(self):
        cfg = small_cfg("llama", attention_softcap=0.5, logit_softcap=2.0)
        model = random_model(cfg, seed=24)
        tokens, targets = random_tokens(cfg, 2, 5, seed=25), random_tokens(cfg, 2, 5, seed=26)
        model.objective(tokens, targets).objective.backward()
        h = 1e-6
        for name, p in model.named_trainable_parameters():
            if name not in ("wte", "h.0.attn.qkv.w"):
                continue
            flat = p.data.view(-1)
            for i in (3, 37):
                numeric = central_difference(model, tokens, targets, flat, i, h)
                self.assertAlmostEqual(p.grad.view(-1)[i].item(), numeric,
                                       delta=1e-7 + 1e-6 * abs(numeric), msg="%s[%d]" % (name, i))

    def test_bad_values_name_the_key(self):
        bad = [("attention_scale_dim", -1), ("attention_scale_dim", 2.5),
               ("attention_scale_dim", True), ("attention_softcap", -0.5),
               ("attention_softcap", float("inf")), ("logit_softcap", float("nan")),
               ("logit_softcap", "30"), ("logit_softcap", False)]
        for key, value in bad:
            with self.subTest((key, value)):
                with self.assertRaisesRegex(torch_model.ConfigError, key):
                    torch_model.normalize_config(small_cfg("llama", **{key: value}))
        filled = torch_model.normalize_config(small_cfg("gpt2", logit_softcap=30))
        self.assertEqual((filled["attention_scale_dim"], filled["attention_softcap"],
                          filled["logit_softcap"]), (0, 0.0, 30.0))


class GradientTest(unittest.TestCase):
    def test_autograd_matches_finite_differences(self):
        for label, cfg in CONFIGS.items():
            with self.subTest(label):
                model = random_model(cfg, seed=10)
                tokens = random_tokens(cfg, 2, 6, seed=11)
                targets = random_tokens(cfg, 2, 6, seed=12)
                model.zero_grad()
                model.objective(tokens, targets).objective.backward()
                gen = torch.Generator().manual_seed(13)
                h = 1e-6
                for name, p in model.named_trainable_parameters():
                    flat = p.data.view(-1)
                    picks = torch.randint(0, flat.numel(), (2,), generator=gen).tolist()
                    if name == "wte":  # make sure rows used as input tokens are probed too
                        picks.append(int(tokens[0, 0]) * cfg["width"])
                    for i in picks:
                        numeric = central_difference(model, tokens, targets, flat, i, h)
                        analytic = p.grad.view(-1)[i].item()
                        self.assertAlmostEqual(analytic, numeric, delta=1e-7 + 1e-6 * abs(numeric),
                                               msg="%s[%d]" % (name, i))

    def test_tied_embedding_gradient_sums_both_uses(self):
        cfg = CONFIGS["gpt2_tied"]
        tied = random_model(cfg, seed=14)
        untied = torch_model.build_model(dict(cfg, tied_embeddings=False)).double()
        with torch.no_grad():
            src = dict(tied.named_contract_parameters())
            for name, p in untied.named_contract_parameters():
                p.copy_(src["wte"] if name == "lm_head.w" else src[name])
        tokens, targets = random_tokens(cfg, 2, 5, 15), random_tokens(cfg, 2, 5, 16)
        tied.loss(tokens, targets)[0].backward()
        untied.loss(tokens, targets)[0].backward()
        torch.testing.assert_close(tied.wte.weight.grad,
                                   untied.wte.weight.grad + untied.lm_head.weight.grad,
                                   rtol=1e-12, atol=1e-14)


class ScheduleTest(unittest.TestCase):
    def test_lr_multiplier_values(self):
        base = {"steps": 10, "warmup_steps": 2, "min_lr_ratio": 0.1}
        cos = dict(base, schedule="cosine")
        self.assertEqual([torch_model.lr_multiplier(s, cos) for s in (0, 1)], [0.5, 1.0])
        self.assertAlmostEqual(torch_model.lr_multiplier(6, cos), 0.55, places=14)  # halfway
        self.assertAlmostEqual(torch_model.lr_multiplier(10, cos), 0.1, places=14)
        self.assertAlmostEqual(torch_model.lr_multiplier(50, cos), 0.1, places=14)  # clipped
        lin = dict(base, schedule="linear")
        self.assertAlmostEqual(torch_model.lr_multiplier(6, lin), 0.55, places=14)
        self.assertAlmostEqual(torch_model.lr_multiplier(4, lin), 0.775, places=14)
        const = dict(base, schedule="constant")
        self.assertEqual([torch_model.lr_multiplier(s, const) for s in (0, 1, 2, 9)],
                         [0.5, 1.0, 1.0, 1.0])
        no_warmup = {"steps": 1, "warmup_steps": 0, "min_lr_ratio": 0.0, "schedule": "cosine"}
        self.assertEqual(torch_model.lr_multiplier(0, no_warmup), 1.0)
        with self.assertRaises(torch_model.ConfigError):
            torch_model.lr_multiplier(0, dict(base, schedule="step"))

    def test_scheduler_drives_optimizer_lr(self):
        cfg = small_cfg("gpt2", steps=6, warmup_steps=2, schedule="linear", lr=0.5)
        model = torch_model.build_model(cfg)
        opt, sched = torch_model.make_optimizer(model, cfg)
        seen = []
        for _ in range(cfg["steps"]):
            seen.append([g["lr"] for g in opt.param_groups])
            opt.step()
            sched.step()
        for s, lrs in enumerate(seen):
            want = 0.5 * torch_model.lr_multiplier(s, cfg)
            self.assertEqual(len(lrs), 2)
            for lr in lrs:
                self.assertAlmostEqual(lr, want, places=15)
        decay = opt.param_groups[0]
        self.assertEqual(decay["weight_decay"], cfg["weight_decay"])
        self.assertTrue(all(p.ndim >= 2 for p in decay["params"]))
        self.assertEqual(opt.param_groups[1]["weight_decay"], 0.0)
        self.assertTrue(all(p.ndim == 1 for p in opt.param_groups[1]["params"]))


class OracleCliTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="torch_oracle_selftest_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_oracle(self, in_dir, out_dir):
        return subprocess.run([sys.executable, os.path.join(HERE, "run_oracle.py"), in_dir, out_dir],
                              capture_output=True, text=True, check=False)

    def check_pipeline(self, cfg, seed):
        in_dir = os.path.join(self.tmp, "in_%d" % seed)
        out_dir = os.path.join(self.tmp, "out_%d" % seed)
        make_example_input.write_example(in_dir, cfg, seed)
        proc = self.run_oracle(in_dir, out_dir)
        self.assertEqual(proc.returncode, 0, proc.stderr)

        # Recompute everything in process from the files the C++ side would write.
        model = torch_model.build_model(cfg).double()
        torch_model.load_params(model, os.path.join(in_dir, "params"), "f32")
        initial = {n: p.detach().clone() for n, p in model.named_contract_parameters()}
        shape = (cfg["steps"], cfg["batch"], cfg["seq_len"])
        inputs = torch.from_numpy(np.fromfile(os.path.join(in_dir, "inputs.i32"), "<i4")
                                  .reshape(shape).astype(np.int64))
        targets = torch.from_numpy(np.fromfile(os.path.join(in_dir, "targets.i32"), "<i4")
                                   .reshape(shape).astype(np.int64))
        result = model.objective(inputs[0], targets[0])
        result.objective.backward()
        loss, logits = result.cross_entropy, result.logits

        got_logits = torch_model.read_array(os.path.join(out_dir, "logits.f64"),
                                            (cfg["batch"], cfg["seq_len"], cfg["vocab"]), "f64")
        np.testing.assert_allclose(got_logits, logits.detach().numpy(), rtol=1e-13, atol=1e-13)
        with open(os.path.join(out_dir, "loss.txt")) as f:
            step0_loss = float(f.read())
        self.assertAlmostEqual(step0_loss, loss.item(), delta=1e-13)
        # The loss equals cross-entropy computed from the written logits by hand.
        flat = got_logits.reshape(-1, cfg["vocab"])
        top = flat.max(-1, keepdims=True)
        lse = np.log(np.exp(flat - top).sum(-1)) + top[:, 0]
        ce = (lse - flat[np.arange(flat.shape[0]), targets[0].reshape(-1).numpy()]).mean()
        self.assertAlmostEqual(step0_loss, ce, delta=1e-12)
        # Gradients of the training objective; the selection biases, untrained, have no file.
        grads_written = sorted(os.listdir(os.path.join(out_dir, "grads")))
        self.assertEqual(grads_written, sorted(n + ".f64" for n, _ in expected_contract(cfg)
                                               if not n.endswith(".moe.router.bias")))
        for name, p in model.named_trainable_parameters():
            g = torch_model.read_array(os.path.join(out_dir, "grads", name + ".f64"),
                                       tuple(p.shape), "f64")
            np.testing.assert_allclose(g, p.grad.numpy(), rtol=1e-12, atol=1e-15, err_msg=name)
        with open(os.path.join(out_dir, "expert_counts.txt")) as f:
            counts = [[int(v) for v in line.split()] for line in f]
        self.assertEqual(counts, [[r.layer] + r.counts.tolist() + [r.dropped]
                                  for r in result.routing])

        with open(os.path.join(out_dir, "losses.txt")) as f:
            losses = [float(line) for line in f]
        with open(os.path.join(out_dir, "aux_losses.txt")) as f:
            aux_losses = [float(line) for line in f]
        self.assertEqual(len(losses), cfg["steps"])
        self.assertEqual(losses[0], step0_loss)
        self.assertEqual(aux_losses[0], result.aux_loss.item())
        want_losses, want_aux, want_final = manual_training(cfg, initial, inputs, targets)
        np.testing.assert_allclose(losses, want_losses, rtol=1e-12)
        np.testing.assert_allclose(aux_losses, want_aux, rtol=1e-12, atol=1e-15)
        moved = {}
        for name, p in want_final.items():
            got = torch_model.read_array(os.path.join(out_dir, "final", name + ".f64"),
                                         tuple(p.shape), "f64")
            # atol covers the key bias, whose gradient is zero up to rounding (softmax is invariant
            # to it) and which Adam therefore moves by normalised rounding noise.
            np.testing.assert_allclose(got, p.numpy(), rtol=1e-9, atol=1e-10, err_msg=name)
            moved[name] = float(np.abs(got - initial[name].numpy()).max())
        self.assertGreater(max(moved.values()), 1e-4)
        return aux_losses, moved

    def test_gpt2_pipeline(self):
        self.check_pipeline(small_cfg("gpt2", steps=4), seed=1)

    def test_llama_pipeline(self):
        self.check_pipeline(small_cfg("llama", steps=4, schedule="linear", warmup_steps=2), seed=2)

    def test_untied_gpt2_without_clipping(self):
        self.check_pipeline(small_cfg("gpt2", tied_embeddings=False, grad_clip=0.0,
                                      schedule="constant", warmup_steps=0, steps=3), seed=3)

    def test_gpt2_moe_pipeline(self):
        cfg = small_cfg("gpt2", steps=3, moe=make_example_input.example_moe(
            capacity_factor=1.0, aux_loss_coeff=0.1))
        aux_losses, _ = self.check_pipeline(cfg, seed=7)
        self.assertTrue(all(v > 0 for v in aux_losses))

    def test_llama_moe_bias_pipeline(self):
        # Layer 1 only is MoE; the selection bias moves by +-rate (or 0) after every step.
        cfg = small_cfg("llama", steps=3, moe=make_example_input.example_moe(
            score="sigmoid", balance="bias", every=2, bias_update_rate=0.01, shared_experts=0))
        aux_losses, moved = self.check_pipeline(cfg, seed=8)
        self.assertEqual(aux_losses, [0.0] * 3)
        self.assertGreater(moved["h.1.moe.router.bias"], 0.005)

    def test_make_example_input_moe_option(self):
        for family in torch_model.FAMILIES:
            with self.subTest(family):
                in_dir = os.path.join(self.tmp, "cli_in_" + family)
                out_dir = os.path.join(self.tmp, "cli_out_" + family)
                # In process: a torch import per subprocess would cost seconds.
                self.assertEqual(make_example_input.main(
                    [in_dir, "--family", family, "--moe", "--steps", "2", "--moe-balance", "bias"]),
                    0)
                with open(os.path.join(in_dir, "config.json")) as f:
                    moe = json.load(f)["moe"]
                self.assertEqual((moe["experts"], moe["top_k"], moe["shared_experts"],
                                  moe["every"], moe["balance"]), (4, 2, 1, 1, "bias"))
                self.assertEqual(run_oracle.main(["run_oracle.py", in_dir, out_dir]), 0)
                with open(os.path.join(out_dir, "expert_counts.txt")) as f:
                    lines = [[int(v) for v in line.split()] for line in f]
                # Both layers; 2*7 tokens with 2 picks each, dropless.
                self.assertEqual([row[0] for row in lines], [0, 1])
                self.assertEqual([sum(row[1:5]) for row in lines], [28, 28])
                self.assertEqual([row[5] for row in lines], [0, 0])
                self.assertTrue(os.path.exists(
                    os.path.join(out_dir, "final", "h.1.moe.router.bias.f64")))

    def test_clipping_is_active(self):
        # With a tiny clip threshold, clipping changes the trajectory: guards that the comparison
        # above would notice a missing or misplaced clip.
        cfg = small_cfg("llama", grad_clip=1e-3, steps=3)
        self.check_pipeline(cfg, seed=4)
        unclipped = dict(cfg, grad_clip=0.0)
        a = torch_model.read_array(os.path.join(self.tmp, "out_4", "final", "wte.f64"),
                                   (cfg["vocab"], cfg["width"]), "f64")
        in_dir = os.path.join(self.tmp, "in_4")
        with open(os.path.join(in_dir, "config.json"), "w") as f:
            json.dump(unclipped, f)
        out_dir = os.path.join(self.tmp, "out_4b")
        self.assertEqual(self.run_oracle(in_dir, out_dir).returncode, 0)
        b = torch_model.read_array(os.path.join(out_dir, "final", "wte.f64"),
                                   (cfg["vocab"], cfg["width"]), "f64")
        self.assertGreater(np.abs(a - b).max(), 1e-6)

    def test_repeated_batch_loss_decreases(self):
        cfg = small_cfg("gpt2", steps=8, lr=3e-2, warmup_steps=0, schedule="constant")
        in_dir = os.path.join(self.tmp, "in_fit")
        make_example_input.write_example(in_dir, cfg, seed=5)
        shape = (cfg["steps"], cfg["batch"], cfg["seq_len"])
        for name in ("inputs.i32", "targets.i32"):
            path = os.path.join(in_dir, name)
            arr = np.fromfile(path, "<i4").reshape(shape)
            np.broadcast_to(arr[:1], shape).astype("<i4").tofile(path)
        out_dir = os.path.join(self.tmp, "out_fit")
        proc = self.run_oracle(in_dir, out_dir)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(os.path.join(out_dir, "losses.txt")) as f:
            losses = [float(line) for line in f]
        self.assertLess(losses[-1], 0.8 * losses[0])

    def test_bad_inputs_exit_2_with_one_line(self):
        cfg = small_cfg("gpt2", steps=2)
        def append_line(d):
            with open(os.path.join(d, "params.txt"), "a") as f:
                f.write("extra 3\n")

        def write_config(d, new_cfg):
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(new_cfg, f)

        cases = {
            "shape": append_line,
            "tokens": lambda d: np.full((2, 2, 7), cfg["vocab"], "<i4").tofile(
                os.path.join(d, "inputs.i32")),
            "size": lambda d: np.zeros(5, "<f4").tofile(os.path.join(d, "params", "lnf.w.f32")),
            "missing": lambda d: os.remove(os.path.join(d, "params", "wpe.f32")),
            "config": lambda d: write_config(d, dict(cfg, seq_len=99)),
            "no_training_key": lambda d: write_config(
                d, {k: v for k, v in cfg.items() if k != "beta2"}),
            "not_json": lambda d: open(os.path.join(d, "config.json"), "w").close(),
            "not_object": lambda d: write_config(d, [1, 2]),
            "moe_top_k": lambda d: write_config(
                d, dict(cfg, moe=make_example_input.example_moe(top_k=5))),
        }
        for label, corrupt in cases.items():
            with self.subTest(label):
                in_dir = os.path.join(self.tmp, "bad_" + label)
                make_example_input.write_example(in_dir, cfg, seed=6)
                corrupt(in_dir)
                proc = self.run_oracle(in_dir, os.path.join(self.tmp, "bad_out_" + label))
                self.assertEqual(proc.returncode, 2, proc.stderr)
                self.assertEqual(len(proc.stderr.strip().splitlines()), 1, proc.stderr)
                self.assertTrue(proc.stderr.startswith("run_oracle: "), proc.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
