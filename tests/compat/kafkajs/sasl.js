#!/usr/bin/env node
// kafkajs over SASL, for tests/compat/test_security.py.
//
//   node sasl.js SPEC_JSON
//     SPEC: {brokers: [..], topic, group, mechanism ("plain"|"scram-sha-256"|
//            "scram-sha-512"), username, password, count}
//   Produces `count` values "v0".."v{count-1}" (acks all), then consumes the
//   topic from the beginning in group `group` until it has them all (30 s at
//   most). Prints one JSON line: {produced, consumed: [values]} or
//   {error: {name, type, message}} when a step is refused.

'use strict';

const { Kafka, logLevel } = require('kafkajs');

async function main() {
  const spec = JSON.parse(process.argv[2]);
  const kafka = new Kafka({
    clientId: 'sasl-js',
    brokers: spec.brokers,
    logLevel: logLevel.NOTHING,
    sasl: { mechanism: spec.mechanism, username: spec.username, password: spec.password },
    retry: { retries: 2, initialRetryTime: 100, maxRetryTime: 500 },
  });
  const producer = kafka.producer();
  await producer.connect();
  const messages = [];
  for (let i = 0; i < spec.count; i++) messages.push({ value: `v${i}` });
  await producer.send({ topic: spec.topic, acks: -1, messages });
  await producer.disconnect();
  const consumer = kafka.consumer({ groupId: spec.group, sessionTimeout: 6000, heartbeatInterval: 1000 });
  await consumer.connect();
  await consumer.subscribe({ topics: [spec.topic], fromBeginning: true });
  const consumed = [];
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => resolve(), 30000);
    consumer.run({
      eachMessage: async ({ message }) => {
        consumed.push(message.value.toString('utf8'));
        if (consumed.length >= spec.count) {
          clearTimeout(timer);
          resolve();
        }
      },
    }).catch(reject);
  });
  await consumer.disconnect();
  process.stdout.write(JSON.stringify({ produced: spec.count, consumed }) + '\n');
}

main().catch((err) => {
  process.stdout.write(JSON.stringify({ error: { name: err.name, type: err.type, message: String(err.message) } }) + '\n');
  process.exit(0);
});
