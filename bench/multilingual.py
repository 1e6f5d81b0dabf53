"""Every shipped clip of every language through the gateway (issue 16): the multilingual base
model's detected language and character error rate per clip, language-ID accuracy, and seconds
per clip of base against tiny.en on the English clips, in one run. Not part of CI.

    .venv/bin/python bench/multilingual.py --json bench/results/multilingual_base.json

Serves examples/whisper-base.yaml, then examples/whisper-tiny-en.yaml (one replica each, on
``--port``), and sends each clip with the OpenAI API (verbose_json, no language given: detected).
CER after NFKC, lower case and punctuation removed. The counting clips come back as digits
("1, 2, 3, ...") from both models, so their CER is high by construction; they are reported
apart.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import unicodedata
from pathlib import Path

import httpx
import jiwer
import yaml

ROOT = Path(__file__).resolve().parents[1]
COUNTING = {"counting", "conteo", "comptage", "ginti", "conteggio", "kazoeru", "liczenie", "contagem", "jishu"}


def norm(s: str) -> str:
    s = re.sub(r"[^\w\s]", "", unicodedata.normalize("NFKC", s).lower())
    return " ".join(s.split())


def serve(example: str, port: int, tmp: Path) -> tuple[subprocess.Popen, dict]:
    torch = example.endswith("+torch")
    example = example.removesuffix("+torch")
    doc = yaml.safe_load((ROOT / "examples" / example).read_text())
    if torch:  # the same model on the torch backend (greedy, fp32 on the CPU), built by `up`
        doc["spec"]["model"]["backend"] = "torch"
        doc["spec"]["model"]["decoding"]["beam_size"] = 1
        doc["spec"]["pools"][0]["target"] = "cpu-x86_64-fp32"
        example = "torch-" + example
    doc["spec"]["pools"][0]["replicas"] = {"min": 1, "max": 1}
    doc["spec"]["gateway"]["port"] = port
    (tmp / example).write_text(yaml.safe_dump(doc))
    (tmp / "local.yaml").write_text(yaml.safe_dump({"cache_dir": str(tmp / "cache")}))
    with open(tmp / f"{example}.log", "w") as log:
        up = subprocess.Popen([str(ROOT / ".venv" / "bin" / "tideserve"), "up", str(tmp / example), "--config",
                               str(tmp / "local.yaml"), "--log-format", "text"], stdout=log, stderr=subprocess.STDOUT)
    return up, doc


def startup_s(log: Path) -> float | None:
    """The replica's start-up (process start to model loaded and ready) from ``up``'s log."""
    m = re.search(r"replica ready .*startup_s=([0-9.]+)", log.read_text())
    return float(m.group(1)) if m else None


def run(example: str, clips: list[tuple[str, Path]], port: int, tmp: Path, named_language: bool = False) -> list[dict]:
    up, doc = serve(example, port, tmp)
    log_name = ("torch-" if example.endswith("+torch") else "") + example.removesuffix("+torch")
    model = doc["spec"]["model"]["name"]
    url = f"http://127.0.0.1:{port}/v1/audio/transcriptions"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5).status_code == 200 and \
                        httpx.post(url, files={"file": ("w.wav", clips[0][1].read_bytes())}, data={"model": model},
                                   timeout=120).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"{example} did not serve; see {tmp / (log_name + '.log')}")
            time.sleep(0.5)
        rows = []
        for lang, wav in clips:
            t = time.perf_counter()
            r = httpx.post(url, files={"file": (wav.name, wav.read_bytes())},
                           data={"model": model, "response_format": "verbose_json",
                                 **({"language": lang} if named_language else {})}, timeout=300)
            seconds = time.perf_counter() - t
            body = r.json()
            ref = wav.with_suffix(".txt").read_text().strip()
            rows.append({"lang": lang, "clip": wav.stem, "detected": body.get("language"), "text": body.get("text"),
                         "reference": ref, "cer": round(jiwer.cer(norm(ref), norm(body.get("text", "")) or "-"), 3),
                         "seconds": round(seconds, 3), "counting": wav.stem in COUNTING})
        rows[0]["replica_startup_s"] = startup_s(tmp / f"{log_name}.log")
        return rows
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(60)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--port", type=int, default=18398)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    import pytest_audioeval

    d = Path(next(iter(pytest_audioeval.__path__))) / "samples" / "audio"
    clips = [(lang.name, wav) for lang in sorted(d.iterdir()) for wav in sorted(lang.glob("*.wav"))]
    tmp = Path(tempfile.mkdtemp(prefix="tideserve-ml-"))
    base = run("whisper-base.yaml", clips, args.port, tmp)
    english = [(lang, wav) for lang, wav in clips if lang == "en"]
    tiny = run("whisper-tiny-en.yaml", english, args.port, tmp)
    # The torch backend does not detect languages: each clip is sent with its language named.
    torch_rows = run("whisper-base.yaml+torch", clips, args.port, tmp, named_language=True)
    speech = [r for r in base if not r["counting"]]
    per_lang = {}
    for lang in sorted({r["lang"] for r in base}):
        rs = [r for r in speech if r["lang"] == lang]
        per_lang[lang] = {"cer_mean_speech_clips": round(statistics.mean(r["cer"] for r in rs), 3),
                          "language_id": f"{sum(r['detected'] == lang for r in base if r['lang'] == lang)}/"
                                         f"{sum(r['lang'] == lang for r in base)}"}
    out = {
        "command": "python bench/multilingual.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "language_id_accuracy": round(sum(r["detected"] == r["lang"] for r in base) / len(base), 3),
        "per_language": per_lang,
        "seconds_per_english_clip": {"base": round(statistics.mean(r["seconds"] for r in base if r["lang"] == "en"), 3),
                                     "tiny.en": round(statistics.mean(r["seconds"] for r in tiny), 3)},
        "clips": base,
        "torch_clips": [],
    }
    out["base_over_tiny_seconds"] = round(out["seconds_per_english_clip"]["base"] / out["seconds_per_english_clip"]["tiny.en"], 2)
    out["replica_startup_s"] = {"base": base[0]["replica_startup_s"], "tiny.en": tiny[0]["replica_startup_s"]}
    out["torch_backend_named_language"] = {
        lang: round(statistics.mean(r["cer"] for r in torch_rows if r["lang"] == lang and not r["counting"]), 3)
        for lang in sorted({r["lang"] for r in torch_rows})}
    out["faster_whisper_named_language_beam5_vs_torch_greedy_note"] = (
        "faster-whisper rows detect the language and decode with beam 5 (the example's settings); the torch rows "
        "name the language and decode greedily (the torch backend's only mode)")
    print(json.dumps({k: v for k, v in out.items() if k != "clips"}, indent=2, ensure_ascii=False))
    for r in base:
        print(f"{r['lang']} {r['clip']:16s} detected={r['detected']} cer={r['cer']:.2f} {r['text'][:50]!r}")
    out["torch_clips"] = torch_rows
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
