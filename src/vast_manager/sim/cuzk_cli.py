"""The command lines of cuzk-daemon and cuzk-bench, as their clap definitions declare them.

Transcribed from Curio ``e0294b0f`` (docs/cuzk.md): ``extern/cuzk/cuzk-daemon/src/main.rs``
(``struct Cli``) and ``extern/cuzk/cuzk-bench/src/main.rs`` (``struct Cli``, ``enum
Commands``, ``enum GenVanillaCommands``). clap derive names every long option after its
field in kebab case, ``#[arg(short)]`` takes the field's first letter, a non-``Option``
field without a default is required, and ``bool`` fields are flags. The simulated
programs parse with these trees (`vast_manager.sim.clap`), so they refuse what the real ones
refuse; tests/fixtures holds an independent transcription that the tests compare with.
"""

from __future__ import annotations

from vast_manager.sim.clap import Arg, Command

SOURCE_COMMIT = "e0294b0f948132d41e8f42f59fa949495d5fd3af"


def _opt(id_: str, kind: str = "string", *, short: str | None = None, default: str | None = None,
         required: bool = False, long: str | None = None) -> Arg:
    return Arg(id_, long or id_.replace("_", "-"), short, kind, default, required)


def _flag(id_: str, default: str | None = None) -> Arg:
    return Arg(id_, id_.replace("_", "-"), None, "flag", default)


# cuzk-daemon/src/main.rs: Cli { config, listen, log_level }
CUZK_DAEMON = Command(
    "cuzk-daemon",
    (
        _opt("config", "path", short="c", default="/data/zk/cuzk.toml"),
        _opt("listen", short="l"),
        _opt("log_level"),
    ),
    about="cuzk proving engine daemon",
)

_SECTOR_MINER = (_opt("sector_num", "u64", default="1"), _opt("miner_id", "u64", default="1000"))
_SNAP_COMMS = (_opt("comm_r_old"), _opt("comm_r_new"), _opt("comm_d_new"))
_GEN_COMMON = (
    _opt("sector_number", "u64", default="1"),
    _opt("miner_id", "u64", default="1000"),
    _opt("randomness"),
    _opt("comm_r", required=True),
    _opt("sealed", "path", required=True),
    _opt("cache", "path", required=True),
)

# cuzk-bench/src/main.rs: Cli { addr, log_level, command: Commands }
CUZK_BENCH = Command(
    "cuzk-bench",
    (
        _opt("addr", short="a", default="http://127.0.0.1:9820"),
        _opt("log_level", default="info"),
    ),
    (
        Command("single", (
            _opt("proof_type", short="t", long="type", required=True),
            _opt("c1", "path"),
            _opt("vanilla", "path"),
            _opt("registered_proof", "u64", default="0"),
            *_SECTOR_MINER,
            _opt("partition", "u32", default="0"),
            _opt("randomness"),
            *_SNAP_COMMS,
        )),
        Command("batch", (
            _opt("proof_type", short="t", long="type", required=True),
            _opt("c1", "path"),
            _opt("vanilla", "path"),
            _opt("registered_proof", "u64", default="0"),
            _opt("count", "u32", short="c", default="3"),
            _opt("concurrency", "u32", short="j", default="1"),
            *_SECTOR_MINER,
            _opt("randomness"),
            *_SNAP_COMMS,
        )),
        Command("status"),
        Command("preload", (_opt("circuit_id", short="c", required=True),)),
        Command("metrics"),
        Command("gen-vanilla", subcommands=(
            Command("winning-post", (
                _opt("registered_proof", "u64", default="3"), *_GEN_COMMON,
                _opt("output", "path", short="o", default="winning-vanilla.json"),
            )),
            Command("window-post", (
                _opt("registered_proof", "u64", default="13"), *_GEN_COMMON,
                _opt("output", "path", short="o", default="wpost-vanilla.json"),
            )),
            Command("snap-prove", (
                _opt("registered_proof", "u64", default="3"),
                _opt("orig_commdr", "path", required=True),
                _opt("update_commdr", "path", required=True),
                _opt("sector_key", "path", required=True),
                _opt("sector_key_cache", "path", required=True),
                _opt("replica", "path", required=True),
                _opt("replica_cache", "path", required=True),
                _opt("output", "path", short="o", default="snap-vanilla.json"),
            )),
        )),
        Command("pce-bench", (
            _opt("c1", "path", required=True), *_SECTOR_MINER,
            _opt("save_pce", "path"), _flag("validate", default="true"),
        )),
        Command("pce-pipeline", (
            _opt("c1", "path", required=True), *_SECTOR_MINER,
            _opt("num_proofs", "u32", short="n", default="3"),
            _opt("parallel", "u32", short="j", default="0"),
            _flag("compare_old"),
        )),
        Command("slotted-bench", (
            _opt("c1", "path", required=True), *_SECTOR_MINER,
            _opt("slot_sizes", default="1,2,3,10"),
            _opt("num_proofs", "u32", short="n", default="1"),
        )),
        Command("synth-only", (
            _opt("c1", "path", required=True), *_SECTOR_MINER,
            _opt("iterations", "u32", short="i", default="1"),
            _opt("partition", "usize"),
        )),
    ),
    about="cuzk proving engine test/benchmark utility",
)

# Subcommands that exist but need cargo features the release build lacks
# (cuzk-bench/Cargo.toml: default = []); the real binary bails with this text.
FEATURE_GATED = {
    "gen-vanilla": "gen-vanilla",
    "pce-bench": "pce-bench",
    "pce-pipeline": "pce-bench",
    "slotted-bench": "pce-bench",
    "synth-only": "synth-bench",
}
