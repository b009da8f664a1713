#!/usr/bin/env python
"""A new user's trial of `prefetch` on a CPU image-classification loop.

Stand-alone. Run with the project's venv:

    .venv/bin/python scripts/new_user_trial.py            # full: 400 JPEGs, 3 repeats
    .venv/bin/python scripts/new_user_trial.py --quick    # small: 96 JPEGs, 1 repeat

Every timed epoch runs in a fresh subprocess (``--child``), one at a time,
configs interleaved within each repeat; medians of the repeats are reported.
Prints two markdown tables (timing, behaviour) plus reproducibility findings.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))

# ----------------------------------------------------------------------------- data


def make_jpegs(folder: str, count: int) -> None:
    """400 (or fewer) synthetic 256x256 RGB JPEGs, quality 90: noise + shapes."""
    import numpy as np
    from PIL import Image, ImageDraw

    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(1234)
    for i in range(count):
        path = os.path.join(folder, f"img_{i:04d}.jpg")
        if os.path.exists(path):
            continue
        base = rng.integers(0, 256, size=(256, 256, 3), dtype=np.uint8)
        # smooth it a bit so it is not pure noise (JPEG-realistic size)
        base = ((base.astype(np.uint16) + np.roll(base, 1, 0) + np.roll(base, 1, 1)) // 3).astype(
            np.uint8
        )
        img = Image.fromarray(base, "RGB")
        draw = ImageDraw.Draw(img)
        for _ in range(6):
            x0, y0 = rng.integers(0, 200, size=2)
            x1, y1 = x0 + rng.integers(20, 120), y0 + rng.integers(20, 120)
            color = tuple(int(c) for c in rng.integers(0, 256, size=3))
            if rng.random() < 0.5:
                draw.ellipse([int(x0), int(y0), int(x1), int(y1)], fill=color)
            else:
                draw.rectangle([int(x0), int(y0), int(x1), int(y1)], fill=color)
        img.save(path, quality=90)


MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def build_dataset(folder: str, sleep_s: float, counter: list | None = None):
    import torch
    from PIL import Image

    import prefetch

    files = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".jpg"))
    mean = torch.tensor(MEAN).view(3, 1, 1)
    std = torch.tensor(STD).view(3, 1, 1)

    class JpegDataset(torch.utils.data.Dataset):
        def __len__(self):
            return len(files)

        def __getitem__(self, i):
            if counter is not None:
                counter.append(i)  # list.append is atomic under the GIL
            if sleep_s:
                time.sleep(sleep_s)  # stands in for a 10 ms network/disk read
            # The guide's documented way: a generator seeded by sample_seed().
            # sample_seed() is None outside fetch threads (plain DataLoader, workers,
            # BackgroundLoader without fetch_threads); then fall back to torch's
            # global generator, which torch seeds per worker process.
            seed = prefetch.sample_seed()
            gen = torch.Generator().manual_seed(seed) if seed is not None else None
            with Image.open(files[i]) as im:
                im = im.convert("RGB")
                w, h = im.size
                box = None
                area = w * h
                for _ in range(10):
                    target = area * float(torch.empty(()).uniform_(0.08, 1.0, generator=gen))
                    logr = float(
                        torch.empty(()).uniform_(math.log(3 / 4), math.log(4 / 3), generator=gen)
                    )
                    ratio = math.exp(logr)
                    cw = int(round(math.sqrt(target * ratio)))
                    ch = int(round(math.sqrt(target / ratio)))
                    if 0 < cw <= w and 0 < ch <= h:
                        x = int(torch.randint(0, w - cw + 1, (1,), generator=gen))
                        y = int(torch.randint(0, h - ch + 1, (1,), generator=gen))
                        box = (x, y, x + cw, y + ch)
                        break
                if box is None:
                    box = (0, 0, w, h)
                im = im.resize((224, 224), Image.BILINEAR, box=box)
                if float(torch.rand((), generator=gen)) < 0.5:
                    im = im.transpose(Image.FLIP_LEFT_RIGHT)
                data = im.tobytes()
            t = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(224, 224, 3)
            t = t.permute(2, 0, 1).float().div_(255).sub_(mean).div_(std)
            return t, i % 10

    return JpegDataset()


def build_model():
    import torch.nn as nn

    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )


# ----------------------------------------------------------------------------- memory


def _statm_rss(pid="self") -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _children(pid: int) -> list[int]:
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class MemSampler(threading.Thread):
    """Every 5 ms: this process's RSS (statm) and the summed PSS of its child processes."""

    def __init__(self, with_children: bool):
        super().__init__(daemon=True, name="memsampler")
        self.with_children = with_children
        self.base = _statm_rss()
        self.peak = self.base
        self.peak_children_pss = 0
        self.max_children = 0
        self._halt = threading.Event()

    def run(self):
        me = os.getpid()
        while not self._halt.is_set():
            self.peak = max(self.peak, _statm_rss())
            if self.with_children:
                kids = _children(me)
                self.max_children = max(self.max_children, len(kids))
                self.peak_children_pss = max(
                    self.peak_children_pss, sum(_pss(k) for k in kids)
                )
            self._halt.wait(0.005)

    def stop(self):
        self._halt.set()
        self.join()
        self.peak = max(self.peak, _statm_rss())


# ----------------------------------------------------------------------------- configs

CONFIGS = {
    "a": "DataLoader(num_workers=0)",
    "b": "DataLoader(num_workers=2)",
    "c": "BackgroundLoader(DL(nw=0))",
    "d": "BackgroundLoader(DL(nw=2))",
    "e": "BackgroundLoader(DL(nw=0), fetch_threads=4)",
    "f": 'BackgroundLoader(DL(nw=0), fetch_threads="auto")',
    "g": "BackgroundLoader(DL(nw=0), fetch_threads=4, in_order=False)",
}


def make_loader(config: str, ds, threads: int = 4):
    from torch.utils.data import DataLoader

    from prefetch import BackgroundLoader

    nw = 2 if config in ("b", "d") else 0
    dl = DataLoader(ds, batch_size=64, shuffle=True, num_workers=nw)
    if config in ("a", "b"):
        return dl
    if config in ("c", "d"):
        return BackgroundLoader(dl)
    if config == "e":
        return BackgroundLoader(dl, fetch_threads=threads)
    if config == "f":
        return BackgroundLoader(dl, fetch_threads="auto")
    if config == "h":  # not in the tables: e with the loading threads' torch ops on one core
        return BackgroundLoader(dl, fetch_threads=threads, num_threads=1)
    if config == "g":
        return BackgroundLoader(dl, fetch_threads=threads, in_order=False)
    raise ValueError(config)


def child_epoch(folder: str, config: str, sleep_s: float, threads: int) -> dict:
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ds = build_dataset(folder, sleep_s)
    loader = make_loader(config, ds, threads)
    lossf = torch.nn.CrossEntropyLoss()
    sampler = MemSampler(with_children=config in ("b", "d"))
    hashes, losses = [], []
    images = 0
    sampler.start()
    time.sleep(0.02)
    t0 = time.perf_counter()
    first = None
    for x, y in loader:
        if first is None:
            first = time.perf_counter() - t0
        h = hashlib.sha256(x.contiguous().numpy().tobytes())
        h.update(y.numpy().tobytes())
        hashes.append(h.hexdigest()[:16])
        opt.zero_grad()
        loss = lossf(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        images += x.shape[0]
    elapsed = time.perf_counter() - t0
    sampler.stop()
    stats = getattr(loader, "stats", None)
    return {
        "config": config,
        "sleep": sleep_s,
        "threads": threads,
        "seconds": elapsed,
        "first": first,
        "images": images,
        "batches": len(hashes),
        "rss_growth": sampler.peak - sampler.base,
        "children_pss": sampler.peak_children_pss,
        "max_children": sampler.max_children,
        "hashes": hashes,
        "final_loss": losses[-1],
        "loss_hex": float(losses[-1]).hex(),
        "summary": stats.summary() if stats is not None else None,
        "fetch_threads": getattr(stats, "fetch_threads", None),
        "peak_fetch_threads": getattr(stats, "peak_fetch_threads", None),
    }


def run_child(args, folder, config, sleep_s, threads=4) -> dict:
    cmd = [
        sys.executable, os.path.abspath(__file__), "--child", config,
        "--folder", folder, "--sleep", str(sleep_s), "--threads", str(threads),
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"child {config} failed rc={p.returncode}:\n{p.stderr[-3000:]}")
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    out = json.loads(line[len("RESULT "):])
    out["stderr"] = p.stderr.strip()[-2000:]
    return out


# ----------------------------------------------------------------------------- behaviour checks


def check_iter_without_next(folder: str) -> str:
    import torch
    from torch.utils.data import DataLoader

    from prefetch import BackgroundLoader

    torch.set_num_threads(1)
    parts = []
    for label, kw in (("no fetch_threads", {}), ("fetch_threads=4", {"fetch_threads": 4})):
        reads: list = []
        ds = build_dataset(folder, 0.0, reads)
        base = {t.name for t in threading.enumerate()}
        it = iter(BackgroundLoader(DataLoader(ds, batch_size=64), **kw))
        n0 = len(reads)
        thr0 = sum(t.name.startswith("prefetch") for t in threading.enumerate())
        time.sleep(1.0)
        n1 = len(reads)
        names = sorted({t.name for t in threading.enumerate()} - base)
        thr1 = sum(t.name.startswith("prefetch") for t in threading.enumerate())
        next(it)
        names2 = sorted({t.name for t in threading.enumerate()} - base)
        thr2 = sum(t.name.startswith("prefetch") for t in threading.enumerate())
        it.close()
        parts.append(
            f"{label}: right after iter() {n0} samples read, {thr0} 'prefetch*' threads; "
            f"1 s later {n1} samples read, {thr1} 'prefetch*' threads (new thread names: {names}); "
            f"after one next(): {thr2} 'prefetch*' threads {names2}"
        )
    return "; ".join(parts)


def check_first_batch_reads(folder: str) -> str:
    import torch
    from torch.utils.data import DataLoader

    from prefetch import BackgroundLoader

    torch.set_num_threads(1)
    reads: list = []
    ds = build_dataset(folder, 0.0, reads)
    it = iter(BackgroundLoader(DataLoader(ds, batch_size=64), fetch_threads=8))
    t0 = time.perf_counter()
    batch = next(it)
    t = time.perf_counter() - t0
    n = len(reads)
    time.sleep(1.0)
    n_later = len(reads)
    it.close()
    return (
        f"next() returned a batch of {batch[0].shape[0]} after {t:.2f} s with {n} samples read "
        f"(1 s later, before close(): {n_later})"
    )


def check_errors() -> str:
    import warnings

    from torch.utils.data import DataLoader

    from prefetch import BackgroundLoader

    out = []
    dl = DataLoader(list(range(10)), batch_size=2)
    for kw in ({"num_workers": 2}, {"fetch_threads": 1000}, {"fetch_threads": 200}):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            try:
                BackgroundLoader(dl, **kw)
                res = "accepted"
            except Exception as e:  # noqa: BLE001
                res = f"{type(e).__name__}: {e}"
        ws = "; ".join(f"{x.category.__name__}: {x.message}" for x in w)
        out.append(f"`{kw}` -> {res}" + (f" [warnings: {ws}]" if ws else ""))
    return " || ".join(out)


def check_max_bytes() -> str:
    import torch
    from torch.utils.data import DataLoader, Dataset

    from prefetch import BackgroundLoader

    torch.set_num_threads(1)

    class Big(Dataset):
        def __len__(self):
            return 64 * 12

        def __getitem__(self, i):
            time.sleep(0.001)
            return torch.rand(3, 224, 224)

    out = []
    for bs in (64, 32):
        batch_bytes = bs * 3 * 224 * 224 * 4
        loader = BackgroundLoader(
            DataLoader(Big(), batch_size=bs), fetch_threads=4, max_bytes=64 << 20
        )
        sampler = MemSampler(with_children=False)
        sampler.start()
        time.sleep(0.05)
        n = 0
        for _ in loader:
            time.sleep(0.3)  # a slow step, so the buffer fills
            n += 1
        sampler.stop()
        s = loader.stats
        out.append(
            f"batch_size={bs}: {n} batches of {batch_bytes / 2**20:.2f} MiB; peak RSS growth "
            f"{(sampler.peak - sampler.base) / 2**20:.0f} MiB; stats.peak_bytes "
            f"{s.peak_bytes / 2**20:.1f} MiB; peak_items {s.peak_items}; peak_samples "
            f"{s.peak_samples}; peak_depth {s.peak_depth}"
        )
        del loader, s
    return "; ".join(out)


def check_sample_seed_plain(folder: str) -> str:
    """What the guide's snippet (``generator=None`` when ``sample_seed()`` is None) does
    without fetch threads: it must run, drawing from torch's global generator."""
    import torch
    from torch.utils.data import DataLoader

    from prefetch import BackgroundLoader, sample_seed

    class Jitter(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            seed = sample_seed()  # None outside fetch threads
            generator = None if seed is None else torch.Generator().manual_seed(seed)
            return i + torch.rand((), generator=generator)

    out = []
    for label, mk in (
        ("DataLoader", lambda: DataLoader(Jitter(), batch_size=4)),
        ("BackgroundLoader(DL)", lambda: BackgroundLoader(DataLoader(Jitter(), batch_size=4))),
    ):
        try:
            list(mk())
            out.append(f"{label}: ok")
        except Exception as e:  # noqa: BLE001
            out.append(f"{label}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    return "; ".join(out)


def check_lightning() -> str:
    try:
        import lightning as L
    except Exception as e:  # noqa: BLE001
        return f"import lightning failed: {e}"
    import logging
    import warnings

    import torch
    from torch.utils.data import DataLoader, Dataset

    from prefetch import BackgroundLoader

    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")

    class Counting(Dataset):
        def __init__(self):
            self.reads = []

        def __len__(self):
            return 64

        def __getitem__(self, i):
            self.reads.append(i)
            time.sleep(0.002)
            return torch.tensor([float(i)])

    def fit(wrap: bool, nw: int):
        L.seed_everything(0, verbose=False)
        ds = Counting()
        seen, info = [], {}

        class M(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(1, 1)

            def training_step(self, batch, idx):
                if idx == 0:
                    info["reads_at_first_step"] = len(ds.reads)
                kids = _children(os.getpid())
                info["max_children"] = max(info.get("max_children", 0), len(kids))
                seen.extend(int(v) for v in batch.view(-1).tolist())
                return self.layer(batch).pow(2).mean()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.01)

            def train_dataloader(self):
                dl = DataLoader(ds, batch_size=8, shuffle=True, num_workers=nw)
                return BackgroundLoader(dl) if wrap else dl

        tr = L.Trainer(
            accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False,
            default_root_dir=tempfile.mkdtemp(),
        )
        tr.fit(M())
        return seen, info

    plain, pi = fit(False, 0)
    wrapped, wi = fit(True, 0)
    plain2, pi2 = fit(False, 2)
    wrapped2, wi2 = fit(True, 2)
    return (
        f"lightning {L.__version__}; nw=0 epoch-0 order identical: {plain == wrapped} "
        f"(plain first batch {plain[:8]}, wrapped {wrapped[:8]}); samples read at first "
        f"training_step: plain {pi['reads_at_first_step']}, wrapped {wi['reads_at_first_step']}; "
        f"nw=2 order identical: {plain2 == wrapped2}; max child processes during steps: "
        f"plain {pi2['max_children']}, wrapped {wi2['max_children']}"
    )


CHECKS = {
    "lightning": ("Lightning fit, plain vs BackgroundLoader", lambda f: check_lightning()),
    "iter": ("iter(loader) without next()", check_iter_without_next),
    "first": ("next(iter(BL(DL(bs=64), fetch_threads=8)))", check_first_batch_reads),
    "errors": ("num_workers=2 / fetch_threads=1000 / 200", lambda f: check_errors()),
    "maxbytes": ("max_bytes=64<<20, fetch_threads=4, float32 3x224x224 samples", lambda f: check_max_bytes()),
    "seedplain": (
        "guide's sample_seed() snippet without fetch_threads",
        check_sample_seed_plain,
    ),
}


def run_check(folder: str, name: str) -> str:
    cmd = [sys.executable, os.path.abspath(__file__), "--check", name, "--folder", folder]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("CHECK ")]
    if p.returncode != 0 or not lines:
        return f"FAILED rc={p.returncode}: {p.stderr.strip()[-800:]}"
    return json.loads(lines[-1][len("CHECK "):])


# ----------------------------------------------------------------------------- main


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return f.read().strip()


def med(xs):
    return statistics.median(xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="96 images, 1 repeat")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--folder", default=None, help="JPEG folder (default: a temp folder)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--check", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--sleep", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=4, help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None, help="also write raw results here")
    args = ap.parse_args()

    if args.child:
        res = child_epoch(args.folder, args.child, args.sleep, args.threads)
        print("RESULT " + json.dumps(res), flush=True)
        return
    if args.check:
        try:
            res = CHECKS[args.check][1](args.folder)
        except Exception:  # noqa: BLE001
            res = "EXCEPTION: " + traceback.format_exc()[-1500:]
        print("CHECK " + json.dumps(res), flush=True)
        return

    n_images = 96 if args.quick else 400
    repeats = args.repeats or (1 if args.quick else 3)
    folder = args.folder or os.path.join(tempfile.gettempdir(), f"new_user_trial_jpegs_{n_images}")
    t = time.perf_counter()
    make_jpegs(folder, n_images)
    print(f"# {n_images} JPEGs in {folder} ({time.perf_counter() - t:.1f} s)", flush=True)

    import torch

    import prefetch

    print(
        f"# python {sys.version.split()[0]}, torch {torch.__version__}, prefetch "
        f"{prefetch.__version__}, cores {os.cpu_count()}; children: torch.set_num_threads(1) "
        f"in the main process, batch_size=64, SGD(lr=0.05, momentum=0.9), torch.manual_seed(0)",
        flush=True,
    )

    # ---- timing: interleaved, one subprocess at a time
    results: dict = {}
    la_before = loadavg()
    variants = (0.0, 0.010)
    for rep in range(repeats):
        for sleep_s in variants:
            for cfg in CONFIGS:
                r = run_child(args, folder, cfg, sleep_s)
                results.setdefault((cfg, sleep_s), []).append(r)
                print(
                    f"#  rep {rep} sleep {sleep_s} {cfg}: {r['seconds']:.2f} s, first "
                    f"{r['first']:.2f} s, loss {r['final_loss']:.5f}",
                    flush=True,
                )
    la_after = loadavg()

    # ---- reproducibility extras: e and g with 2 threads, f again (plain decode)
    extra = {}
    la_rep_before = loadavg()
    for cfg, thr in (("e", 2), ("g", 2), ("f", 2), ("e", 4), ("f", 4)):
        extra.setdefault((cfg, thr), []).append(run_child(args, folder, cfg, 0.0, thr))
    la_rep_after = loadavg()

    print()
    print(f"## Table 1: one epoch, {n_images} JPEGs, batch 64, medians of {repeats} interleaved runs")
    print(f"load average before: `{la_before}`; after: `{la_after}`")
    print()
    print(
        "| variant | config | epoch s | img/s | vs a | vs b | first batch s | peak RSS growth MiB "
        "(main + workers' PSS) | final loss | fetch threads (end/peak) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for sleep_s in variants:
        base_a = med([r["seconds"] for r in results[("a", sleep_s)]])
        base_b = med([r["seconds"] for r in results[("b", sleep_s)]])
        for cfg, name in CONFIGS.items():
            rs = results[(cfg, sleep_s)]
            sec = med([r["seconds"] for r in rs])
            imgs = rs[0]["images"]
            first = med([r["first"] for r in rs])
            rss = med([r["rss_growth"] for r in rs]) / 2**20
            kids = med([r["children_pss"] for r in rs]) / 2**20
            mem = f"{rss:.0f} + {kids:.0f}" if cfg in ("b", "d") else f"{rss:.0f}"
            losses = sorted({f"{r['final_loss']:.6f}" for r in rs})
            ft = ", ".join(sorted({f"{r['fetch_threads']}/{r['peak_fetch_threads']}" for r in rs}))
            variant = "decode" if sleep_s == 0 else "+10 ms"
            print(
                f"| {variant} | {cfg}: `{name}` | {sec:.2f} | {imgs / sec:.0f} | "
                f"{base_a / sec:.2f}x | {base_b / sec:.2f}x | {first:.2f} | {mem} | "
                f"{' / '.join(losses)} | {ft if cfg in 'efg' else '-'} |"
            )
    print()

    # ---- reproducibility findings
    print("## Reproducibility (plain decode and +10 ms; same seed)")
    print(f"load average (extra runs) before: `{la_rep_before}`; after: `{la_rep_after}`")
    for sleep_s in variants:
        variant = "decode" if sleep_s == 0 else "+10 ms"
        seqs = {cfg: [tuple(r["hashes"]) for r in results[(cfg, sleep_s)]] for cfg in CONFIGS}
        lossx = {cfg: [r["loss_hex"] for r in results[(cfg, sleep_s)]] for cfg in CONFIGS}
        for cfg in CONFIGS:
            same = len(set(seqs[cfg])) == 1
            sl = len(set(lossx[cfg])) == 1
            print(f"- {variant} {cfg}: {repeats} runs identical batches: {same}, loss: {sl}")
        ref = {}
        for cfg in CONFIGS:
            ref[cfg] = seqs[cfg][0]
        groups: dict = {}
        for cfg in "abcdef":
            groups.setdefault(ref[cfg], []).append(cfg)
        print(
            f"- {variant}: configs with bit-identical batch sequences (ordered): "
            f"{[''.join(g) for g in groups.values()]}"
        )
        ms = sorted(ref["g"])
        print(
            f"- {variant}: g (in_order=False) sorted multiset == e's: {ms == sorted(ref['e'])}; "
            f"same order as e: {ref['g'] == ref['e']}"
        )
        lg: dict = {}
        for cfg in "abcdefg":
            lg.setdefault(lossx[cfg][0], []).append(cfg)
        print(f"- {variant}: configs with identical final loss: {[''.join(g) for g in lg.values()]}")
    e4 = tuple(results[("e", 0.0)][0]["hashes"])
    for (cfg, thr), rs in extra.items():
        r = rs[0]
        h = tuple(r["hashes"])
        cmp = (sorted(h) == sorted(e4)) if cfg == "g" else (h == e4)
        print(
            f"- extra {cfg} {'auto run ' + str(thr // 2) if cfg == 'f' else 'threads=' + str(thr)} (stats fetch_threads {r['fetch_threads']}, peak "
            f"{r['peak_fetch_threads']}): {'multiset' if cfg == 'g' else 'ordered batches'} "
            f"identical to e(4 threads): {cmp}; loss identical: {r['loss_hex'] == results[('e', 0.0)][0]['loss_hex']}"
        )
    print()

    # ---- stats summaries
    print("## stats.summary() (first run of each, +10 ms)")
    for cfg in "cdefg":
        print(f"- {cfg}: `{results[(cfg, 0.010)][0]['summary']}`")
    print("## stats.summary() (first run of each, decode)")
    for cfg in "cdefg":
        print(f"- {cfg}: `{results[(cfg, 0.0)][0]['summary']}`")
    stderrs = {
        f"{k[0]}/{k[1]}": rs[0]["stderr"] for k, rs in results.items() if rs[0]["stderr"]
    }
    if stderrs:
        print("## stderr of children (first run)")
        for k, v in stderrs.items():
            print(f"- {k}: `{v[:600]}`")
    print()

    # ---- behaviour checks
    la_b = loadavg()
    rows = []
    for name, (title, _) in CHECKS.items():
        rows.append((title, run_check(folder, name)))
    la_a = loadavg()
    print("## Table 2: behaviour checks")
    print(f"load average before: `{la_b}`; after: `{la_a}`")
    print()
    print("| check | what happened |")
    print("|---|---|")
    for title, res in rows:
        res = str(res).replace("|", "\\|").replace("\n", " ")
        print(f"| {title} | {res} |")
    c_sum = results[("c", 0.010)][0]["summary"] or ""
    print(
        f"| stats.summary() of c (+10 ms) | `{c_sum}` — mentions fetch_threads: "
        f"{'fetch_threads' in c_sum} |"
    )

    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "timing": {f"{k[0]}|{k[1]}": v for k, v in results.items()},
                    "extra": {f"{k[0]}|{k[1]}": v for k, v in extra.items()},
                    "checks": rows,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
