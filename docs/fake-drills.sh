#!/bin/bash
# The drills of docs/operations.md, "Rehearsing on the fake vast.ai", in one run.
export VM_ADMIN_TOKEN=drill-token-0123456789abcdef0123
export VM_FLEET_SECRET=abababababababababababababababababababababababababababababababab
export VM_URL=http://127.0.0.1:18422
export VM_VAST_WEBHOOK_SECRET=whsec-drill-0123456789
export VM_MONITOR_INTERVAL_S=10
export VM_MAX_USD_PER_PROOF=0.02
# vast-manager on PATH (the project's venv); the coordinator answers at VM_URL.
D=${DRILL_DIR:-$(mktemp -d)}
rm -f $D/fleet.db* ; rm -rf $D/fake-vast-instances
setsid vast-manager serve --provider fake --db $D/fleet.db --port 18422 > $D/serve.log 2>&1 &
echo $! > $D/serve.pid
until vast-manager fake show > /dev/null 2>&1; do sleep 1; done
run() { echo "\$ $*"; "$@" 2>&1; echo; }
echo "=== drill: the daily search quota"
run vast-manager fake quota 2
run vast-manager offers --filter "num_gpus>=1" --json > /dev/null
run vast-manager offers --filter "num_gpus>=2" --json > /dev/null
vast-manager offers --filter "num_gpus>=1" | tail -1 | sed 's/^/$ vast-manager offers --filter "num_gpus>=1" | tail -1\n/'
echo; echo '$ vast-manager offers --filter "num_gpus>=4"'; vast-manager offers --filter "num_gpus>=4" 2>&1 | tail -2; echo
run vast-manager status
echo '$ curl -s -H "Authorization: Bearer $VM_ADMIN_TOKEN" $VM_URL/metrics | grep "^vm_vast_search"'
curl -s -H "Authorization: Bearer $VM_ADMIN_TOKEN" $VM_URL/metrics | grep "^vm_vast_search"; echo
grep "search quota" $D/serve.log | head -2; echo
echo "=== drill: deploy two instances"
run vast-manager deploy 9003
run vast-manager deploy 9002
sleep 40
run vast-manager status
echo "=== drill: a host raises its price"
run vast-manager fake price-increase 1 0.25
run vast-manager fake price-increase 2 3.00
sleep 12
echo '$ vast-manager instance 1 | grep price_increase'; vast-manager instance 1 | grep -i "price.increase"; echo
echo '$ vast-manager instance 2 | grep price_increase'; vast-manager instance 2 | grep -i "price.increase"; echo
echo "=== drill: a host goes offline (with the webhook)"
run vast-manager fake offline 1 --for 30
sleep 2
grep "webhook" $D/serve.log | tail -2; echo
echo '$ vast-manager instance 1 | grep kept'; vast-manager instance 1 | grep -i "kept"; echo
echo "=== drill: a status that never runs"
run vast-manager fake status 2 exited
sleep 25
echo '$ vast-manager instance 2 | grep -i "destroy\|dead\|strike"'; vast-manager instance 2 | grep -i "destroy\|dead\|strike" | head -5; echo
echo "=== drill: renters' reports on a blocked machine"
run vast-manager bad-hosts add 41002 --reason "exited in the drill"
run vast-manager fake report 41002 gpu_error --message "GPU fell off the bus"
sleep 12
run vast-manager bad-hosts list
echo "=== drill: the funds run out, then come back"
run vast-manager fake funds -- -1000
sleep 12
run vast-manager status
run vast-manager fake funds 1000
sleep 25
run vast-manager status
echo "=== drill: the API key is revoked"
run vast-manager fake revoke-key
sleep 12
run vast-manager status
run vast-manager deploy 9004
kill $(cat $D/serve.pid)
sleep 8
echo "=== drill: an outbid interruptible instance (the autopilot's trials at a bid)"
rm -f $D/fleet2.db*
VM_INTERRUPTIBLE_TRIALS=1 VM_AUTOPILOT_INTERVAL_S=5 setsid vast-manager serve --provider fake --db $D/fleet2.db --port 18422 --autopilot --target-rate 90 --max-dph 0.5 --max-instances 1 > $D/serve2.log 2>&1 &
echo $! > $D/serve.pid
until vast-manager fake show > /dev/null 2>&1; do sleep 1; done
sleep 45
run vast-manager status
BID=$(vast-manager fake show --json | python3 -c "import json,sys; print(json.load(sys.stdin)['instances'][0]['bid_price'])")
run vast-manager fake outbid 1 --winning-bid $(python3 -c "print(round($BID * 1.2, 4))")
sleep 25
echo '$ vast-manager instance 1 | grep -i "outbid\|resumed"'; vast-manager instance 1 | grep -i "outbid\|resumed"; echo
run vast-manager fake show
kill $(cat $D/serve.pid)
sleep 5
