"""Ask every served variant of risk_tabular over HTTP and gRPC; compare with the fp32 eager module; a bad row."""
import sys
import time

import numpy as np
import torch

sys.path.insert(0, "src")
from risk.model import build  # noqa: E402

from tpserve.clients.infer import infer  # noqa: E402
from tpserve.common import endpoints  # noqa: E402
from tpserve.common.errors import ClientError  # noqa: E402

state = endpoints.read_state(__import__("pathlib").Path(sys.argv[1]))
print("left out:", state.left_out)
module = build().eval()
rng = np.random.default_rng()
rows = {"features": rng.uniform(-5, 5, (8, 16)).astype(np.float32), "category": rng.integers(0, 3, (8, 1))}
with torch.no_grad():
    want = [o.numpy() for o in module(torch.from_numpy(rows["features"]), torch.from_numpy(rows["category"]))]
import urllib.request, json  # noqa: E401,E402
index = json.loads(urllib.request.urlopen(urllib.request.Request(
    f"http://{state.http_url}/v2/repository/index", data=b"{}", headers=dict(state.admin_headers()))).read())
print("index:", [(m["name"], m.get("state")) for m in index])
for model in sorted(m["name"] for m in index if m.get("state") == "READY"):
    for protocol in ("http", "grpc"):
        ep = state.endpoint(protocol)
        got = infer(ep, model, rows).outputs
        diffs = [float(np.abs(got[n] - w).max()) for n, w in zip(("score", "probs"), want)]
        print(f"{model} {protocol}: shapes {got['score'].shape} {got['probs'].shape} max|diff| vs fp32 eager {diffs}")
        bad = {k: v.copy() for k, v in rows.items()}
        bad["features"][5, 3] = np.nan
        try:
            infer(ep, model, bad)
            print("  NaN row ANSWERED")
        except ClientError as err:
            print("  NaN row refused:", str(err)[:160])
        t = time.perf_counter()
        for _ in range(200):
            infer(ep, model, {k: v[:1] for k, v in rows.items()})
        print(f"  one row, 200 sequential calls (client in Python): {(time.perf_counter() - t) / 200 * 1e3:.3f} ms each")
