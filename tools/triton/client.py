"""Loads every entry of the model repository make_repository.py wrote into a running Triton server (explicit
model control), sends each model its requests from several concurrent clients (tritonclient[http], one
client object per thread, binary tensors both ways) and compares every output bit for bit with Python
onnxruntime's (the .npz files). The entry without model_operations must fail to load with a domain op named
in the server's load error. Exit status 1 on any difference or failure (scripts/triton.sh).
"""
import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

TIMEOUT = 600.0


def wait_ready(url, pid, seconds=120):
    client = httpclient.InferenceServerClient(url)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if pid:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                sys.exit("client: the server exited before it was ready")
        try:
            if client.is_server_live() and client.is_server_ready():
                return client
        except Exception:  # not listening yet
            pass
        time.sleep(0.25)
    sys.exit(f"client: the server was not ready within {seconds} s")


def run_client(url, model, requests):
    """One client: its requests in turn; the list of (file, problems)."""
    client = httpclient.InferenceServerClient(url, connection_timeout=TIMEOUT, network_timeout=TIMEOUT)
    results = []
    try:
        for request in requests:
            data = np.load(request["file"])
            inputs = []
            for name in model["inputs"]:
                array = data[f"in/{name}"]
                if array.ndim == 0:
                    array = array.reshape(1)
                tensor = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
                tensor.set_data_from_numpy(array, binary_data=True)
                inputs.append(tensor)
            outputs = [httpclient.InferRequestedOutput(name, binary_data=True) for name in model["outputs"]]
            problems = []
            try:
                response = client.infer(model["name"], inputs, outputs=outputs)
            except InferenceServerException as error:
                results.append((request["file"], [f"request failed: {error}"]))
                continue
            for name in model["outputs"]:
                want = data[f"out/{name}"]
                got = response.as_numpy(name)
                if got is None:
                    problems.append(f"{name}: missing from the response")
                    continue
                if want.ndim == 0 and got.shape == (1,):  # a scalar travels as [1] (reshape in the config)
                    got = got.reshape(())
                if got.dtype != want.dtype or got.shape != want.shape or got.tobytes() != want.tobytes():
                    diff = (np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)), initial=0)
                            if got.shape == want.shape else "n/a")
                    problems.append(f"{name}: {got.dtype}{list(got.shape)} vs {want.dtype}{list(want.shape)}, "
                                    f"max |diff| {diff}")
            results.append((request["file"], problems))
    finally:
        client.close()
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--cases", required=True, type=Path)
    parser.add_argument("--server-pid", type=int, default=0)
    args = parser.parse_args()
    manifest = json.loads((args.cases / "manifest.json").read_text())
    failures = []
    client = wait_ready(args.url, args.server_pid)
    meta = client.get_server_metadata()
    print(f"client: server {meta['name']} {meta['version']}, library {manifest['library']}")

    # The entry without model_operations: its load must fail, the error naming one of the model's domain ops.
    bare = manifest["must_fail"]
    try:
        client.load_model(bare["name"])
        failures.append(f"{bare['name']}: loaded without model_operations")
    except InferenceServerException as error:
        message = str(error)
        named = [op for op in bare["ops"] if f"{bare['domain']}:{op}" in message]
        if named and "is not a registered function/op" in message:
            print(f"client: {bare['name']}: failed to load, as it must: "
                  f"...{message[message.find(bare['domain']):][:120].strip()}")
        else:
            failures.append(f"{bare['name']}: failed to load, but the error names no op of domain "
                            f"{bare['domain']}: {message[:400]}")
    index = {m["name"]: m for m in client.get_model_repository_index()}
    state = index.get(bare["name"], {})
    if state.get("state") == "READY":
        failures.append(f"{bare['name']}: the repository index says READY")

    for model in manifest["models"]:
        name = model["name"]
        started = time.monotonic()
        try:
            client.load_model(name)
        except InferenceServerException as error:
            failures.append(f"{name}: failed to load: {error}")
            continue
        if not client.is_model_ready(name):
            failures.append(f"{name}: loaded but not ready")
            continue
        loaded = time.monotonic() - started
        by_client = {}
        for request in model["requests"]:
            by_client.setdefault(request["client"], []).append(request)
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=len(by_client)) as pool:
            futures = [pool.submit(run_client, args.url, model, reqs) for reqs in by_client.values()]
            results = [r for f in futures for r in f.result()]
        served = time.monotonic() - started
        bad = [(file, problems) for file, problems in results if problems]
        # The statistics are updated once a response has gone: wait (briefly) until they count every row.
        rows = len(model["requests"])
        if model["batched"]:
            rows = sum(int(np.load(r["file"])[f"in/{model['inputs'][0]}"].shape[0]) for r in model["requests"])
        for _ in range(40):
            stats = client.get_inference_statistics(name)["model_stats"][0]
            if int(stats["inference_count"]) >= rows:
                break
            time.sleep(0.05)
        detail = (f"{stats['inference_count']} inferences in {stats['execution_count']} executions, "
                  f"load {loaded:.1f} s, {served:.1f} s serving")
        if bad:
            for file, problems in bad:
                failures.append(f"{name}: {Path(file).name}: {len(problems)} of {len(model['outputs'])} outputs: "
                                + "; ".join(problems[:4]))
        else:
            print(f"client: {name}: {len(results)} responses from {len(by_client)} concurrent clients, all "
                  f"{len(model['outputs'])} output{'s' if len(model['outputs']) != 1 else ''} each bit-identical "
                  f"to Python onnxruntime ({detail})")
        client.unload_model(name)  # keeps the server's memory to one model at a time
    client.close()
    if failures:
        print("client: FAILED\n  " + "\n  ".join(failures), file=sys.stderr)
        sys.exit(1)
    print(f"client: OK: {len(manifest['models'])} models")


if __name__ == "__main__":
    main()
