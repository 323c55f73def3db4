"""The bytes each message encodes to, pinned: the wire contract (docs/protocol.md) is
these bytes, and a change of how messages are declared (dataclasses, msgspec Structs)
must not move one of them. Each message holds what encodes differently between JSON
writers (a float's exponent, a float that is a whole number, non-ASCII and escaped text,
an absent optional field), and the decoded body re-encodes to the same bytes."""

from __future__ import annotations

import pytest

from vast_manager.protocol import messages as m
from vast_manager.protocol.codec import decode, encode

GPU_TELEMETRY = m.GpuTelemetry(0, 97.25, 100.0, 21_000_000_000, 1.2e6, 5.5e-5, 412.3, 71.0,
                               2520.5, 4, pcie_gen_current=4)
TELEMETRY = m.Telemetry(
    15.0, 15, [GPU_TELEMETRY],
    m.CpuTelemetry(42.5, [10.5, 90.0, 1e-7], 12.25, 0.4),
    m.RamTelemetry(40_000_000_000, None), m.NetTelemetry(1.2e20, 3e5),
    cuzk=m.CuzkTelemetry(15, [m.CuzkWorker(0, 98.5)], 1.5, 4, 0.25, 2**40, None,
                         synthesis_slots=3),
)
DIRECTIVE = m.Directive("benchmark", "a re-benchmark: \"why\" \u00e9\n", 15, 1234.5,
                        benchmark_id="bm_1", stored_result_seq=7)

MESSAGES: dict[str, object] = {
    "hello": m.Hello(1, "0.1.0", "boot-\u00e9", None, m.HostInfo(
        "host-1", "AMD EPYC 7K62 48-Core Processor", 32, 16, 2**40, "570.133.07", None,
        [m.Gpu(0, "GPU-1", "NVIDIA GeForce RTX 4090", 25_757_220_864, 4, 16, None, 8)])),
    "heartbeat": m.Heartbeat(12, "proving", 1_765_000_000.125, m.Progress(3, 10, "proofs", 2),
                             7, [301.25, 2.0], TELEMETRY, net_bytes_total=m.NetBytesTotal(1, 2),
                             acked_seq=5),
    "heartbeat, extensions absent": m.Heartbeat(1, "booting", 0.0, None, 0, [], None),
    "result": m.Result("r-1", "scaling", "porep-c2", 1.0, 2.5, [0, 1], 3, 0, 1.5, 1e16,
                       [0.5], None, runs=[m.ScalingRun([0], 60.0, TELEMETRY)],
                       efficiency=0.9, bottleneck="pcie", evidence=["x\ty"],
                       benchmark_id=None, spool_seq=9, receipt="rc", prev_acked_seq=8),
    "log batch": m.LogBatch([m.LogLine(1.5, "cuzk", "line \u2028 \x00 </script>")], spool_seq=2,
                              prev_acked_seq=None),
    "directive": DIRECTIVE,
    "result ack": m.ResultAck(True, False, DIRECTIVE, receipt="rc"),
    "error": m.ErrorBody("invalid_field", "Field 'seq' is missing.", "seq"),
}

# Written by the encoder of the message dataclasses (orjson) before they became Structs.
EXPECTED: dict[str, bytes] = {
    'directive': (
        b'{"action":"benchmark","reason":"a re-benchmark: \\"why\\" \xc3\xa9\\n","next_hear'
        b'tbeat_s":15,"min_rate_per_hour":1234.5,"benchmark_id":"bm_1","stored_res'
        b'ult_seq":7,"stored_logs_seq":null}'
    ),
    'error': (
        b'{"error":"invalid_field","message":"Field \'seq\' is missing.","field":"se'
        b'q"}'
    ),
    'heartbeat': (
        b'{"seq":12,"phase":"proving","phase_started_at":1765000000.125,"progress"'
        b':{"done":3,"total":10,"unit":"proofs","concurrency":2},"proofs_completed'
        b'_total":7,"proof_seconds_recent":[301.25,2.0],"telemetry":{"window_s":15'
        b'.0,"samples":15,"gpus":[{"index":0,"util_pct_mean":97.25,"util_pct_max":'
        b'100.0,"mem_used_bytes":21000000000,"pcie_tx_kbps_mean":1200000.0,"pcie_r'
        b'x_kbps_mean":0.000055,"power_w_mean":412.3,"temp_c_max":71.0,"sm_clock_m'
        b'hz_mean":2520.5,"throttle_reasons":4,"pcie_gen_current":4,"pcie_width_cu'
        b'rrent":null}],"cpu":{"util_pct_mean":42.5,"per_core_util_pct_mean":[10.5'
        b',90.0,1e-7],"load1":12.25,"iowait_pct_mean":0.4,"quota_cores":null},"ram'
        b'":{"used_bytes":40000000000,"total_bytes":null},"net":{"rx_bytes_per_s":'
        b'1.2e+20,"tx_bytes_per_s":300000.0},"cuzk":{"samples":15,"workers":[{"gpu'
        b'_ordinal":0,"busy_pct":98.5}],"synthesis_active_mean":1.5,"synthesis_max'
        b'":4,"queue_depth_mean":0.25,"memory_used_bytes_max":1099511627776,"memor'
        b'y_total_bytes":null,"synthesis_slots":3}},"failure":null,"net_bytes_tota'
        b'l":{"rx":1,"tx":2},"acked_seq":5}'
    ),
    'heartbeat, extensions absent': (
        b'{"seq":1,"phase":"booting","phase_started_at":0.0,"progress":null,"proof'
        b's_completed_total":0,"proof_seconds_recent":[],"telemetry":null,"failure'
        b'":null,"net_bytes_total":null,"acked_seq":null}'
    ),
    'hello': (
        b'{"protocol":1,"agent_version":"0.1.0","boot_id":"boot-\xc3\xa9","container_id"'
        b':null,"host":{"hostname":"host-1","cpu_model":"AMD EPYC 7K62 48-Core Pro'
        b'cessor","cpu_cores_logical":32,"cpu_cores_physical":16,"ram_total_bytes"'
        b':1099511627776,"driver_version":"570.133.07","cuda_version":null,"gpus":'
        b'[{"index":0,"uuid":"GPU-1","name":"NVIDIA GeForce RTX 4090","memory_tota'
        b'l_bytes":25757220864,"pcie_gen_max":4,"pcie_width_max":16,"pcie_gen_curr'
        b'ent":null,"pcie_width_current":8}]}}'
    ),
    'log batch': (
        b'{"lines":[{"ts":1.5,"source":"cuzk","text":"line \xe2\x80\xa8 \\u0000 </script>"}]'
        b',"spool_seq":2,"prev_acked_seq":null}'
    ),
    'result': (
        b'{"result_id":"r-1","kind":"scaling","proof_type":"porep-c2","started_at"'
        b':1.0,"finished_at":2.5,"gpus_used":[0,1],"proofs_completed":3,"proofs_fa'
        b'iled":0,"wall_seconds":1.5,"rate_per_hour":1e+16,"proof_seconds":[0.5],"'
        b'telemetry":null,"runs":[{"gpus_used":[0],"rate_per_hour":60.0,"telemetry'
        b'":{"window_s":15.0,"samples":15,"gpus":[{"index":0,"util_pct_mean":97.25'
        b',"util_pct_max":100.0,"mem_used_bytes":21000000000,"pcie_tx_kbps_mean":1'
        b'200000.0,"pcie_rx_kbps_mean":0.000055,"power_w_mean":412.3,"temp_c_max":'
        b'71.0,"sm_clock_mhz_mean":2520.5,"throttle_reasons":4,"pcie_gen_current":'
        b'4,"pcie_width_current":null}],"cpu":{"util_pct_mean":42.5,"per_core_util'
        b'_pct_mean":[10.5,90.0,1e-7],"load1":12.25,"iowait_pct_mean":0.4,"quota_c'
        b'ores":null},"ram":{"used_bytes":40000000000,"total_bytes":null},"net":{"'
        b'rx_bytes_per_s":1.2e+20,"tx_bytes_per_s":300000.0},"cuzk":{"samples":15,'
        b'"workers":[{"gpu_ordinal":0,"busy_pct":98.5}],"synthesis_active_mean":1.'
        b'5,"synthesis_max":4,"queue_depth_mean":0.25,"memory_used_bytes_max":1099'
        b'511627776,"memory_total_bytes":null,"synthesis_slots":3}}}],"efficiency"'
        b':0.9,"bottleneck":"pcie","evidence":["x\\ty"],"benchmark_id":null,"spool_'
        b'seq":9,"receipt":"rc","prev_acked_seq":8}'
    ),
    'result ack': (
        b'{"ok":true,"duplicate":false,"directive":{"action":"benchmark","reason":'
        b'"a re-benchmark: \\"why\\" \xc3\xa9\\n","next_heartbeat_s":15,"min_rate_per_hour"'
        b':1234.5,"benchmark_id":"bm_1","stored_result_seq":7,"stored_logs_seq":nu'
        b'll},"receipt":"rc"}'
    ),
}


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_each_message_encodes_to_the_pinned_bytes(name: str) -> None:
    message = MESSAGES[name]
    assert encode(message) == EXPECTED[name]
    assert encode(decode(type(message), EXPECTED[name])) == EXPECTED[name]
    assert decode(type(message), EXPECTED[name]) == message
