#!/usr/bin/env node
// kafkajs driver for shardlog's compatibility tests (tests/compat/test_kafkajs.py).
//
//   node roundtrip.js produce SPEC.json OUT.json
//     SPEC: {brokers, topic, acks, idempotent, compression ("none"|"gzip"),
//            sendSize, records: [{key, value, headers: [[name, value], ...]}]}
//            (keys and values base64). Sends the records in order, `sendSize`
//            per awaited send() call, with the Java-compatible default partitioner.
//     OUT:  {sent, metadata: [RecordMetadata...]} (one list entry per send call).
//
//   node roundtrip.js admin SPEC.json OUT.json
//     SPEC: {brokers, topic, partitions}
//     Creates the topic (with retention.ms=3600000), lists topics, fetches its
//     metadata, describes its configs, fetches its offsets, deletes it and
//     lists again; OUT has every answer for the Python side to check.
//
//   node roundtrip.js listGroups SPEC.json OUT.json
//     SPEC: {brokers}
//     OUT:  admin.listGroups()'s answer, {groups: [{groupId, protocolType}]}
//     (kafkajs asks every node of the Metadata answer and concatenates).
//
//   node roundtrip.js adminApis SPEC.json OUT.json
//     SPEC: {brokers, topic, node}
//     The broker-level admin calls, each recorded as {ok: answer} or
//     {error: {name, type, code, message, errors}}: describeConfigs of the
//     broker `node` (with synonyms), alterConfigs of its log.retention.ms and
//     then of num.partitions (read-only), describeCluster, createTopics
//     with a replica assignment and with one naming an unknown node,
//     createPartitions likewise, and the topic's metadata after each.
//
//   node roundtrip.js reassign SPEC.json OUT.json
//     SPEC: {brokers, topic, partition, replicas}
//     admin.alterPartitionReassignments of that partition to `replicas`,
//     then admin.listPartitionReassignments until the move is gone (60 s at
//     most); OUT: {altered, listed (the first list), done, badNode (a move to
//     node 77, which no machine has)}, each {ok} or {error}.
//
// kafkajs has no manual-assignment consumer (its consumer needs groups), so
// the Python side reads the produced records back with confluent-kafka.

'use strict';

const fs = require('fs');
const { Kafka, logLevel, Partitioners, CompressionTypes, ConfigResourceTypes } = require('kafkajs');

function client(spec) {
  return new Kafka({
    clientId: 'shardlog-compat-kafkajs',
    brokers: spec.brokers,
    logLevel: logLevel.WARN,
    connectionTimeout: 5000,
    requestTimeout: 30000,
    retry: { retries: 8, initialRetryTime: 100, maxRetryTime: 2000 },
  });
}

function toMessage(r) {
  const headers = {};
  for (const [name, value] of r.headers) {
    const v = Buffer.from(value, 'base64');
    if (name in headers) {
      headers[name] = [].concat(headers[name], [v]);
    } else {
      headers[name] = v;
    }
  }
  return { key: Buffer.from(r.key, 'base64'), value: Buffer.from(r.value, 'base64'), headers };
}

const COMPRESSION = {
  none: CompressionTypes.None,
  gzip: CompressionTypes.GZIP,
};

async function produce(spec) {
  const kafka = client(spec);
  const options = { createPartitioner: Partitioners.DefaultPartitioner, allowAutoTopicCreation: false };
  if (spec.idempotent) {
    Object.assign(options, { idempotent: true, maxInFlightRequests: 1 });
  }
  const producer = kafka.producer(options);
  await producer.connect();
  const compression = COMPRESSION[spec.compression || 'none'];
  if (compression === undefined) throw new Error(`unsupported compression ${spec.compression}`);
  const messages = spec.records.map(toMessage);
  const metadata = [];
  let sent = 0;
  try {
    for (let i = 0; i < messages.length; i += spec.sendSize) {
      const chunk = messages.slice(i, i + spec.sendSize);
      const md = await producer.send({ topic: spec.topic, acks: spec.acks, compression, messages: chunk });
      metadata.push(md);
      sent += chunk.length;
    }
  } finally {
    await producer.disconnect();
  }
  return { sent, metadata };
}

async function admin(spec) {
  const kafka = client(spec);
  const a = kafka.admin();
  await a.connect();
  const out = {};
  try {
    out.created = await a.createTopics({
      waitForLeaders: true,
      topics: [{ topic: spec.topic, numPartitions: spec.partitions, replicationFactor: 1,
                 configEntries: [{ name: 'retention.ms', value: '3600000' }] }],
    });
    out.createdAgain = await a.createTopics({ topics: [{ topic: spec.topic, numPartitions: 1 }] });
    out.listed = await a.listTopics();
    out.metadata = await a.fetchTopicMetadata({ topics: [spec.topic] });
    out.cluster = await a.describeCluster();
    out.configs = await a.describeConfigs({
      includeSynonyms: false,
      resources: [{ type: ConfigResourceTypes.TOPIC, name: spec.topic }],
    });
    await a.alterConfigs({
      validateOnly: false,
      resources: [{ type: ConfigResourceTypes.TOPIC, name: spec.topic,
                    configEntries: [{ name: 'retention.ms', value: '7200000' }] }],
    });
    out.configsAfterAlter = await a.describeConfigs({
      includeSynonyms: false,
      resources: [{ type: ConfigResourceTypes.TOPIC, name: spec.topic, configNames: ['retention.ms'] }],
    });
    out.offsets = await a.fetchTopicOffsets(spec.topic);
    await a.createPartitions({ topicPartitions: [{ topic: spec.topic, count: spec.partitions + 2 }] });
    out.metadataAfterGrow = await a.fetchTopicMetadata({ topics: [spec.topic] });
    await a.deleteTopics({ topics: [spec.topic], timeout: 10000 });
    const deadline = Date.now() + 10000;
    do {
      out.listedAfterDelete = await a.listTopics();
      if (!out.listedAfterDelete.includes(spec.topic)) break;
      await new Promise((r) => setTimeout(r, 100));
    } while (Date.now() < deadline);
  } finally {
    await a.disconnect();
  }
  return out;
}

async function listGroups(spec) {
  const a = client(spec).admin();
  await a.connect();
  try {
    return await a.listGroups();
  } finally {
    await a.disconnect();
  }
}

async function attempt(call) {
  try {
    const answer = await call();
    return { ok: answer === undefined ? null : answer };
  } catch (err) {
    const nested = (err.errors || []).map((e) => ({ type: e.type, code: e.code, message: e.message }));
    return { error: { name: err.name, type: err.type, code: err.code, message: err.message, errors: nested } };
  }
}

async function adminApis(spec) {
  const a = client(spec).admin();
  await a.connect();
  const broker = { type: ConfigResourceTypes.BROKER, name: String(spec.node) };
  const topic = spec.topic;
  const out = {};
  try {
    out.describeBroker = await attempt(() => a.describeConfigs({ resources: [broker], includeSynonyms: true }));
    out.alterRetention = await attempt(() => a.alterConfigs({
      validateOnly: false,
      resources: [{ ...broker, configEntries: [{ name: 'log.retention.ms', value: '5400000' }] }],
    }));
    out.describeRetention = await attempt(() => a.describeConfigs({
      resources: [{ ...broker, configNames: ['log.retention.ms'] }], includeSynonyms: true,
    }));
    out.alterReadOnly = await attempt(() => a.alterConfigs({
      validateOnly: false,
      resources: [{ ...broker, configEntries: [{ name: 'num.partitions', value: '9' }] }],
    }));
    out.describeCluster = await attempt(() => a.describeCluster());
    out.createAssigned = await attempt(() => a.createTopics({
      waitForLeaders: true,
      topics: [{ topic, replicaAssignment: [{ partition: 0, replicas: [1] }, { partition: 1, replicas: [0] }] }],
    }));
    out.metadataCreated = await attempt(() => a.fetchTopicMetadata({ topics: [topic] }));
    out.createUnknownNode = await attempt(() => a.createTopics({
      topics: [{ topic: `${topic}-bad`, replicaAssignment: [{ partition: 0, replicas: [77] }] }],
    }));
    out.growAssigned = await attempt(() => a.createPartitions({
      topicPartitions: [{ topic, count: 3, assignments: [[1]] }],
    }));
    out.growUnknownNode = await attempt(() => a.createPartitions({
      topicPartitions: [{ topic, count: 4, assignments: [[77]] }],
    }));
    out.metadataGrown = await attempt(() => a.fetchTopicMetadata({ topics: [topic] }));
    out.listTopics = await attempt(() => a.listTopics());
  } finally {
    await a.disconnect();
  }
  return out;
}

async function reassign(spec) {
  const a = client(spec).admin();
  await a.connect();
  const out = {};
  try {
    const move = (replicas) => a.alterPartitionReassignments({
      topics: [{ topic: spec.topic, partitionAssignment: [{ partition: spec.partition, replicas }] }],
    });
    out.altered = await attempt(() => move(spec.replicas));
    out.listed = await attempt(() => a.listPartitionReassignments({}));
    const deadline = Date.now() + 60000;
    out.done = false;
    while (Date.now() < deadline) {
      const listed = await a.listPartitionReassignments({});
      if (!listed.topics.some((t) => t.topic === spec.topic)) {
        out.done = true;
        break;
      }
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
    out.badNode = await attempt(() => move([77]));
  } finally {
    await a.disconnect();
  }
  return out;
}

async function main() {
  const [command, specPath, outPath] = process.argv.slice(2);
  if (!command || !specPath || !outPath) {
    throw new Error('usage: roundtrip.js produce|admin|listGroups|adminApis|reassign SPEC.json OUT.json');
  }
  const spec = JSON.parse(fs.readFileSync(specPath, 'utf8'));
  let out;
  if (command === 'produce') out = await produce(spec);
  else if (command === 'admin') out = await admin(spec);
  else if (command === 'listGroups') out = await listGroups(spec);
  else if (command === 'adminApis') out = await adminApis(spec);
  else if (command === 'reassign') out = await reassign(spec);
  else throw new Error(`unknown command ${command}`);
  fs.writeFileSync(outPath, JSON.stringify(out, null, 1));
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(err && err.stack ? err.stack : err);
    process.exit(1);
  },
);
