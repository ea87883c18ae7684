"""A plugin written from scratch in a temporary folder (not the shipped example): a protocol, an
attack with per-victim scores and a defense that adds a message kind and an int8 payload. It
registers through the registry API, passes ``privaudit.testing``, and its transcripts (defense
on) validate in memory and after a round trip through a file; its protocol declares its client
round in blocks and shards over a Dask LocalCluster; all without touching a core file."""

from __future__ import annotations

import importlib
import sys
import textwrap

import numpy as np
import pytest

from privaudit import experiment, registry, schema, testing
from privaudit.errors import PrivauditError, TranscriptError

PLUGIN = textwrap.dedent(
    '''
    """tinyrec: clients upload centred ratings per rated item; the server keeps item means."""

    import numpy as np
    import scipy.sparse as sp

    from privaudit.attacks.base import Attack, Reconstruction
    from privaudit.defenses.base import UPLOAD, Defense
    from privaudit.params import Param
    from privaudit.protocols.base import (
        BlockPart, BlockRound, BlockRun, Protocol, RunResult, plain_sum, utility_specs_of,
    )
    from privaudit.results import MetricSpec, VictimTable
    from privaudit.schema import (
        GRAD_ROWS, ITEMS, RATINGS, DefenseSchema, MessageSchema, PayloadField, ProtocolSchema,
    )


    def _rows(R):
        return [(R.indices[R.indptr[u]:R.indptr[u + 1]].astype(np.int64), R.data[R.indptr[u]:R.indptr[u + 1]])
                for u in range(R.shape[0])]


    class TinyBlocks(BlockRound):
        """A block of clients: its rows of the ratings; its round's partials: the sums and counts
        of its uploads by item."""

        upload_kinds = ("grad_V",)

        def __init__(self, n_items):
            self.n_items = n_items

        @classmethod
        def open(cls, protocol, setup):
            data = setup.dataset
            R = sp.csr_matrix(data.ratings)
            public = {"K": 1, "n_items": data.n_items, "rating_min": data.rating_min, "rating_max": data.rating_max}
            senders = [f"client:{u}" for u in range(data.n_users)]
            transcript = protocol.open_transcript(setup.config, data, [], setup.seed, ["server", *senders], **public)
            means = np.full(data.n_items, float(R.data.mean()))

            def train(clients):
                for r in range(setup.config["iterations"]):
                    values, counts = clients.round(r, True, means)
                    seen = counts > 0
                    means[seen] += values[seen] / counts[seen]
                return RunResult(transcript, means, {"rmse": _rmse(R, means)})

            return BlockRun(cls(data.n_items), data.n_users, transcript, lambda b, lo, hi: R[lo:hi], train)

        def private(self, R):
            return [({"items": items, "ratings": ratings}, None) for items, ratings in _rows(R)]

        def round(self, R, t, record, means):
            payloads = [{"items": i, "values": (v - means[i])[:, None]} for i, v in _rows(R)]
            total = plain_sum(payloads, rows=self.n_items)
            partials = (total["values"][:, 0], total["counts"].astype(float))
            return BlockPart(partials, [("grad_V", payloads)] if record else None)


    class WrongKinds(TinyBlocks):  # for the conformance test: a kind the schema does not upload
        upload_kinds = ("grad_W",)


    class HookedBlocks(TinyBlocks):  # for the conformance test: a round no worker could receive
        def __init__(self, n_items):
            super().__init__(n_items)
            self.hook = lambda x: x  # a lambda does not pickle


    def _rmse(R, means):
        coo = R.tocoo()
        return float(np.sqrt(np.mean((means[coo.col] - coo.data) ** 2)))


    class TinyRec(Protocol):
        """Each round every client uploads rating - item mean for its rated items."""

        description = "tinyrec: item means from per-item residual uploads (test plugin)"
        parameters = (Param("iterations", 2, "upload rounds (every client uploads in each)", ge=1),)
        schema = ProtocolSchema(
            config_keys=("K", "n_items", "rating_min", "rating_max"),
            dims={"m": "n_items", "K": "K"},
            messages=(
                MessageSchema("private", "client", "self", (ITEMS, RATINGS)),
                MessageSchema("grad_V", "client", "server", GRAD_ROWS, upload=True, required=True),
            ),
        )
        utility_specs = utility_specs_of("rmse")
        main_utility = "rmse"
        derived_keys = ("K", "n_items", "rating_min", "rating_max")
        block_round = TinyBlocks  # its clients run in blocks: privaudit.sharded spreads them over workers

        @classmethod
        def release_count(cls, config):
            return config.get("iterations")

        def simulate(self, setup):
            if not setup.defenses:
                return self.simulate_blocks(setup)  # the blocks in this process, as a sharded run's workers
            data = setup.dataset
            R = sp.csr_matrix(data.ratings)
            senders = [f"client:{u}" for u in range(data.n_users)]
            rows = _rows(R)
            private = {s: {"items": rows[u][0], "ratings": rows[u][1]} for u, s in enumerate(senders)}
            public = {"K": 1, "n_items": data.n_items, "rating_min": data.rating_min, "rating_max": data.rating_max}
            (rng,) = setup.streams(1)
            transcript, channel = self.start(setup, ["server", *senders], private, rng, **public)
            means = np.full(data.n_items, float(R.data.mean()))
            for r in range(setup.config["iterations"]):
                payloads = [{"items": i, "values": (v - means[i])[:, None]} for i, v in rows]
                total = channel.sum(channel.send(r, "grad_V", senders, payloads), rows=data.n_items)
                seen = total["counts"] > 0
                means[seen] += np.asarray(total["values"], float)[seen, 0] / total["counts"][seen]
            return RunResult(transcript, means, {"rmse": _rmse(R, means)})


    class RatedItems(Attack):
        """The server guesses that a client rated exactly the items it uploads rows for."""

        description = "tinyrec: rated iff uploaded (test plugin)"
        protocols = ("tinyrec",)
        requires = ("grad_V",)
        primary_metric = "accuracy"
        metric_specs = {"accuracy": MetricSpec(True, True, "fraction", "(client, item) pairs guessed right")}
        null_keeps_ids = False  # its leak is the id set: the null view gives it another client's ids

        def applicable(self, view):
            return super().applicable(view)

        def run(self, view, knowledge, rng):
            guess = {}
            for m in view.select("grad_V", round=0):
                guess[m.sender] = {"items": np.asarray(m.payload["items"], np.int64)}
            return Reconstruction(self.name, self.party, guess)

        def _table(self, recon, transcript):
            m = int(transcript.config["n_items"])
            victims = sorted(recon.victims)
            hits, prior = [], []
            for v in victims:
                truth = np.zeros(m, bool)
                truth[transcript.private(v)["items"]] = True
                guess = np.zeros(m, bool)
                guess[recon.victims[v]["items"]] = True
                hits.append(float(np.sum(truth == guess)))
                prior.append(float(m - truth.sum()))  # the majority guess: nothing rated
            weight = [float(m)] * len(victims)
            return VictimTable(victims, {"accuracy": weight}, {"accuracy": hits}, {"accuracy": prior})

        def score(self, recon, transcript):
            return {"accuracy": self._table(recon, transcript).value("accuracy")}

        def baseline(self, transcript):
            return {"accuracy": 0.5}

        def prior_baseline(self, transcript, knowledge):
            clients = transcript.clients()
            recon = Reconstruction(self.name, self.party, {c: {"items": np.zeros(0, np.int64)} for c in clients})
            return {"accuracy": self._table(recon, transcript).value("accuracy", "prior")}

        def victim_table(self, recon, transcript, knowledge):
            return self._table(recon, transcript)


    class PseudoSeed(Defense):
        """Clients quantize their rows to int8 and announce a pseudo-random seed."""

        description = "tinyrec: int8 rows plus a pseudo_seed message (test plugin)"
        parameters = (Param("step", 0.5, "quantization step of the int8 rows", gt=0),)
        strength = "step"
        default_grid = (0.5, 1.0)
        capabilities = frozenset({UPLOAD})
        acts_on = (("grad_V", "values"),)
        schema_contribution = DefenseSchema(
            messages=(MessageSchema("pseudo_seed", "client", "server", (PayloadField("seed", "uint8", (8,)),)),),
            payload_dtypes={("grad_V", "values"): "int8"},
        )

        def process_uploads(self, uploads, ctx, call_next):
            for batch in uploads.batches:
                for sender, p in zip(batch.senders, batch.payloads):
                    p["values"] = np.clip(np.round(p["values"] / self.step), -127, 127).astype(np.int8)
                    if batch.recorded:
                        seed = ctx.rng.integers(0, 256, 8).astype(np.uint8)
                        ctx.transcript.add(batch.round, sender, "server", "pseudo_seed", {"seed": seed})
            return call_next(uploads)
    '''
)


@pytest.fixture
def tinyrec(tmp_path, monkeypatch):
    (tmp_path / "tinyrec_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("tinyrec_plugin")
    registry.available("protocol")
    registry.register_protocol("tinyrec")(module.TinyRec)
    registry.register_attack("tinyrec-rated")(module.RatedItems)
    registry.register_defense("pseudo-seed")(module.PseudoSeed)
    try:
        yield module
    finally:
        for kind, name in (("protocol", "tinyrec"), ("attack", "tinyrec-rated"), ("defense", "pseudo-seed")):
            registry.unregister(kind, name)
        sys.modules.pop("tinyrec_plugin", None)


def test_a_new_plugin_passes_the_conformance_suite(tinyrec):
    assert tinyrec.TinyRec.name == "tinyrec" and "name" not in vars(tinyrec.TinyRec)  # named, not mutated
    testing.check_protocol(tinyrec.TinyRec)
    out = testing.check_attack(tinyrec.RatedItems, protocol="tinyrec")
    assert out.metrics["accuracy"] == 1.0 and out.victims is not None
    t = testing.check_defense(tinyrec.PseudoSeed, protocol="tinyrec")
    kinds = t.kinds()
    assert kinds["pseudo_seed"] == 40 * 2 and t.select("grad_V")[0].payload["values"].dtype == np.int8
    # the attack on the defended run, read from a file: the composed schema admits it
    defended = testing.check_attack(tinyrec.RatedItems, protocol="tinyrec", defenses=[tinyrec.PseudoSeed()])
    assert defended.metrics["accuracy"] == 1.0  # quantizing values hides no item ids


def test_file_path_and_sweep_path_accept_the_defense_and_name_the_culprit(tinyrec, tmp_path):
    from privaudit.data import synthetic

    data = synthetic(**testing.DATASET)
    run = tinyrec.TinyRec().run(data, {}, [tinyrec.PseudoSeed()], 0)
    path = run.transcript.save(tmp_path / "run.ptx")
    res = experiment.attack_transcript(path, "tinyrec-rated")
    assert res["points"][0]["supported"] and res["points"][0]["attack_metrics"]["accuracy"] == 1.0
    swept = experiment.build_experiment(
        protocol="tinyrec", attack="tinyrec-rated", defenses=["pseudo-seed"], seeds=1
    ).run(data)
    assert swept["points"][0]["attack_metrics"]["accuracy"] == 1.0
    # the victim table gives the verdict its interval: int8 rows hide no item ids
    assert "the attack leaks on accuracy (lower bound" in str(swept["verdicts"])
    # the protocol's own uploads must not be int8 without the defense: the error names both parts
    bare = tinyrec.TinyRec().run(data, {}, [], 0).transcript
    m = bare.select("grad_V")[0]
    m.payload["values"] = m.payload["values"].astype(np.int8)
    with pytest.raises(TranscriptError, match=r"dtype int8 is not float$"):
        schema.validate(bare)
    # a defense's message with a wrong payload names the defense, not the protocol label
    seed = run.transcript.select("pseudo_seed")[0]
    seed.payload["seed"] = np.zeros(8, np.float64)
    with pytest.raises(TranscriptError, match=r"'seed': dtype float64 is not uint8"):
        schema.validate(run.transcript)
    seed.payload["extra"] = np.zeros(1, np.uint8)
    with pytest.raises(
        TranscriptError, match=r"'extra' is not part of a 'pseudo_seed' message as defense 'pseudo-seed'"
    ):
        schema.validate(run.transcript)
    # unregistered, the defense contributes nothing: the kind is unknown and the message says why
    registry.unregister("defense", "pseudo-seed")
    try:
        with pytest.raises(TranscriptError, match=r"nor one a listed defense declares \(pseudo-seed\); not registered"):
            schema.validate(run.transcript)
    finally:
        registry.register_defense("pseudo-seed")(tinyrec.PseudoSeed)


def test_the_plugin_protocol_shards_over_a_local_cluster(tinyrec, tmp_path):
    """The plugin's protocol declares its round in blocks: spread over a 2-worker LocalCluster (7
    blocks of 6 clients), its folder loads to the transcript of the same blocks in one process,
    message for message; the merged run round-trips through a file and the attack reads it."""
    pytest.importorskip("dask.distributed")
    from privaudit import sharded
    from privaudit.data import synthetic
    from privaudit.protocols.base import RunSetup

    data = synthetic(**testing.DATASET)
    config = tinyrec.TinyRec.resolve_config({"iterations": 3})
    local = tinyrec.TinyRec().simulate_blocks(RunSetup(config, data, [], 5), block_size=6)
    (tmp_path / "run").mkdir()
    with sharded.dask_client("local:2") as client:  # after the fixture: the workers import the plugin
        done = sharded.run_sharded("tinyrec", data, config, 5, client, tmp_path / "run", block_size=6)
    assert len(done.worker_peak) == 2 and sharded.read_manifest(tmp_path / "run")["protocol"] == "tinyrec"
    merged = sharded.load_validated(tmp_path / "run")
    assert len(merged) == 40 + 3 * 40  # private messages, then three rounds of uploads
    for a, b in zip(local.transcript.messages, merged.messages, strict=True):
        assert (a.seq, a.round, a.sender, a.receiver, a.kind) == (b.seq, b.round, b.sender, b.receiver, b.kind)
        assert a.payload.keys() == b.payload.keys()
        assert all(np.array_equal(a.payload[k], b.payload[k]) for k in a.payload), a.seq
    assert np.array_equal(local.model, done.result.model) and local.utility == done.result.utility
    assert 0.5 < local.utility["rmse"] < 2.0  # item means of 1..5 ratings
    # the merged run round-trips through a file; the attack reads the folder and the file alike
    path = merged.save(tmp_path / "merged.ptx")
    for source in (path, merged):
        point = experiment.attack_transcript(source, "tinyrec-rated")["points"][0]
        assert point["attack_metrics"]["accuracy"] == 1.0 > point["baseline_prior"]["accuracy"] > 0.5
    # a protocol that declares no block round is refused in one line, naming the ones that can
    with pytest.raises(PrivauditError, match=r"'fedncf' does not run in client blocks .* tinyrec"):
        sharded.run_sharded("fedncf", data, {}, 0, None, tmp_path / "x")


def test_the_conformance_suite_checks_a_block_round(tinyrec):
    """``check_protocol`` runs a declared block round in process: kinds the schema does not
    declare as client uploads, or a round a worker could not receive, fail it, naming the check."""
    cases = (
        (tinyrec.WrongKinds, r"upload_kinds \('grad_W',\) must be client uploads the schema declares \(grad_V\)"),
        (tinyrec.HookedBlocks, "what a sharded run sends its workers does not pickle"),
    )
    for rounds, fragment in cases:
        broken = type("Broken", (tinyrec.TinyRec,), {"block_round": rounds})
        registry.register_protocol("tinyrec-broken")(broken)
        try:
            with pytest.raises(testing.ConformanceError, match=r"Broken \(block round\): " + fragment):
                testing.check_protocol(broken)
        finally:
            registry.unregister("protocol", "tinyrec-broken")


def test_the_plugin_is_audited_like_a_built_in(tinyrec, tmp_path, capsys):
    """``privaudit audit`` on the plugin: undefended and under its int8 defense (which hides no item
    id) the attack reads "leaks" (advantage 0.080 over its prior, measured), and audit.json validates."""
    import json

    from privaudit.cli import main

    out = tmp_path / "audit"
    # --jobs 1: registered through the API in this process (worker processes see entry points only)
    argv = ["audit", "--protocol", "tinyrec", "--defense", "pseudo-seed", "--seeds", "2", "--jobs", "1"]
    code = main([*argv, "-o", str(out)])
    assert code == 0, capsys.readouterr().err
    doc = json.loads((out / "audit.json").read_text())
    cells = {(c["defense"], c["value"]): c for c in doc["matrix"]}
    assert cells[(None, None)]["verdict"] == "leaks" and cells[("pseudo-seed", 1.0)]["verdict"] == "leaks"
    assert cells[("pseudo-seed", 1.0)]["advantage"] == pytest.approx(0.080, abs=0.01)
    assert "tinyrec-rated (accuracy): leaks; no tested defense is shown to stop it" in capsys.readouterr().out
