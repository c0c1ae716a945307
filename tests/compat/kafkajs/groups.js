#!/usr/bin/env node
// One kafkajs consumer-group member as its own process, for
// tests/compat/test_groups.py (the Python twin is tests/compat/groups_consumer.py).
//
//   node groups.js SPEC_JSON
//     SPEC: {bootstrap: "host:port[,..]", group, topics: [..],
//            session_timeout_ms?, heartbeat_interval_ms?, client_id?, rack_id?,
//            retries? (the consumer's retry count, 30 by default)}
//
// Subscribes (fromBeginning, kafkajs' default round-robin assigner, which is
// eager), processes each fetched batch by printing its records, then commits
// the batch's next offset synchronously (autoCommit off). Every event is one
// JSON line on stdout with `t` = seconds since the epoch:
//   {"ev":"start"} {"ev":"assigned","parts":[[topic,partition],..]}
//   {"ev":"revoked","parts":[..]} (a rebalance began: kafkajs stops fetching)
//   {"ev":"rec","topic":T,"p":P,"o":O,"v":value}
//   {"ev":"committing","offsets":[[T,P,next]]} (about to send)
//   {"ev":"commit","offsets":[[T,P,next]]} (it succeeded) {"ev":"commit_error","err":".."}
//   {"ev":"error","err":"..","restart":bool} (consumer crash; kafkajs restarts itself on retriable ones)
//   {"ev":"revoked","parts":[..],"closing":true} (SIGTERM: it consumes no more)
//   {"ev":"closed"} (after consumer.disconnect(), which sends LeaveGroup)
// SIGTERM leaves gracefully; SIGKILL is the crash case.

'use strict';

const { Kafka, logLevel } = require('kafkajs');

function emit(ev, fields) {
  // stdout to a pipe is synchronous on Linux, so a line written is a line
  // the parent reads even if this process is SIGKILLed right after.
  process.stdout.write(JSON.stringify(Object.assign({ ev, t: Date.now() / 1000 }, fields || {})) + '\n');
}

function flatten(assignment) {
  const out = [];
  for (const [topic, partitions] of Object.entries(assignment || {})) {
    for (const p of partitions) out.push([topic, p]);
  }
  out.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : a[1] - b[1]));
  return out;
}

async function main() {
  const spec = JSON.parse(process.argv[2]);
  const kafka = new Kafka({
    clientId: spec.client_id || 'groups-consumer-js',
    brokers: spec.bootstrap.split(','),
    // GROUPS_JS_DEBUG=1 logs every request and retry (to stderr, which the
    // tests keep next to the member's name).
    logLevel: process.env.GROUPS_JS_DEBUG ? logLevel.DEBUG : logLevel.WARN,
    logCreator: () => ({ namespace, label, log }) => {
      process.stderr.write(JSON.stringify(Object.assign({ level: label, ns: namespace }, log)) + '\n');
    },
    connectionTimeout: 3000,
    requestTimeout: 30000,
    retry: { retries: 30, initialRetryTime: 100, maxRetryTime: 1000 },
  });
  const retries = spec.retries === undefined ? 30 : spec.retries;
  const sessionTimeout = spec.session_timeout_ms || 6000;
  const consumer = kafka.consumer({
    groupId: spec.group,
    sessionTimeout,
    rebalanceTimeout: Math.max(sessionTimeout, 10000),
    heartbeatInterval: spec.heartbeat_interval_ms || 1000,
    // KIP-392: with a rack, the leader may send this member to a follower.
    rackId: spec.rack_id,
    // The fetch loop is where kafkajs heartbeats and notices rebalances.
    maxWaitTimeInMs: 200,
    // How long a failing step is retried before the consumer restarts
    // (crash with restart: true, which finds the coordinator again).
    retry: { retries, initialRetryTime: 100, maxRetryTime: 1000 },
  });
  let current = [];
  consumer.on(consumer.events.GROUP_JOIN, (e) => {
    current = flatten(e.payload.memberAssignment);
    emit('assigned', { parts: current });
  });
  consumer.on(consumer.events.REBALANCING, () => {
    emit('revoked', { parts: current });
    current = [];
  });
  consumer.on(consumer.events.CRASH, (e) => {
    emit('error', { err: String(e.payload.error), restart: !!e.payload.restart });
  });

  let closing = false;
  const close = async () => {
    if (closing) return;
    closing = true;
    emit('revoked', { parts: current, closing: true });
    try {
      await consumer.disconnect();
    } finally {
      emit('closed');
      process.exit(0);
    }
  };
  process.on('SIGTERM', close);
  process.on('SIGINT', close);

  emit('start');
  await consumer.connect();
  await consumer.subscribe({ topics: spec.topics, fromBeginning: true });
  await consumer.run({
    autoCommit: false,
    eachBatchAutoResolve: false,
    eachBatch: async ({ batch, resolveOffset, heartbeat, isRunning, isStale }) => {
      let last = null;
      for (const m of batch.messages) {
        if (!isRunning() || isStale()) break;
        emit('rec', {
          topic: batch.topic, p: batch.partition, o: Number(m.offset),
          v: m.value === null ? null : m.value.toString('utf8'),
        });
        resolveOffset(m.offset);
        last = m.offset;
      }
      if (last !== null) {
        const next = (BigInt(last) + 1n).toString();
        emit('committing', { offsets: [[batch.topic, batch.partition, Number(next)]] });
        try {
          await consumer.commitOffsets([{ topic: batch.topic, partition: batch.partition, offset: next }]);
          emit('commit', { offsets: [[batch.topic, batch.partition, Number(next)]] });
        } catch (e) {
          emit('commit_error', { err: String(e) });
        }
      }
      await heartbeat();
    },
  });
}

main().catch((err) => {
  emit('error', { err: String(err && err.stack ? err.stack : err), fatal: true });
  process.exit(1);
});
