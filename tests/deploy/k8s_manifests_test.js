// The Kubernetes manifests of deploy/k8s, checked offline:
// - every object of every kustomization (base, overlays, with components) and of
//   tfjob.yaml validates against Kubernetes' schemas (npm's kubernetes-models), with no
//   field the schemas do not know (a typo would otherwise pass until `kubectl apply`);
// - the kustomizations are rendered by a small renderer of the kustomize features they
//   use (and, where kubectl is installed, compared with `kubectl kustomize`);
// - names, ports and replica counts agree across Services, StatefulSets, the Job, the
//   ConfigMaps, the Dockerfile's binaries and tfjob.yaml;
// - the real binaries print the TF_CONFIG every pod would compute (--print_tf_config), in
//   the plain manifests and under the TFJob operator's TF_CONFIG, and it matches the DNS
//   names Kubernetes gives the pods; scaling a role is one number.
//
//   node k8s_manifests_test.js --source DIR --bin DIR --node-modules DIR
// The packages come from install_node_packages.sh (the CTest fixture k8s_node_packages).
'use strict';

const assert = require('node:assert/strict');
const childProcess = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { test } = require('node:test');
const { createRequire } = require('node:module');

function option(name) {
  const index = process.argv.indexOf(name);
  if (index < 0 || index + 1 >= process.argv.length) {
    console.error(`k8s_manifests_test.js: missing ${name} DIR`);
    process.exit(2);
  }
  return path.resolve(process.argv[index + 1]);
}

const SOURCE = option('--source');
const BIN = option('--bin');
const NODE_MODULES = option('--node-modules');
const K8S = path.join(SOURCE, 'deploy', 'k8s');
const NAMESPACE = 'stratum-test';

let load;
try {
  load = createRequire(path.join(NODE_MODULES, '..', 'package.json'));
  load.resolve('kubernetes-models/v1');
  load.resolve('yaml');
} catch (error) {
  console.error(`k8s_manifests_test.js: kubernetes-models and yaml are not in ${NODE_MODULES} ` +
                `(${error.message}); run tests/deploy/install_node_packages.sh`);
  process.exit(1);
}
const YAML = load('yaml');
const { render, readYamlDocuments, podSpec, find, containerOf, podEnvironment, podsOf } =
  require('./k8s_render')({ YAML, namespace: NAMESPACE });

// ---------------------------------------------------------------------------------------
// Schemas: kubernetes-models' validators (types, required fields, formats) plus a check for
// unknown fields, from the property lists of its TypeScript declarations.

const MODELS = {
  'v1/Service': 'kubernetes-models/v1/Service',
  'v1/ConfigMap': 'kubernetes-models/v1/ConfigMap',
  'v1/PersistentVolumeClaim': 'kubernetes-models/v1/PersistentVolumeClaim',
  'v1/Secret': 'kubernetes-models/v1/Secret',
  'apps/v1/StatefulSet': 'kubernetes-models/apps/v1/StatefulSet',
  'batch/v1/Job': 'kubernetes-models/batch/v1/Job',
  'v1/PodTemplateSpec': 'kubernetes-models/v1/PodTemplateSpec',
};

const declarations = new Map();  // .d.ts path -> {props, imports}

// The properties of the interface a .d.ts file declares: name -> type text.
function parseDeclaration(file) {
  if (declarations.has(file)) return declarations.get(file);
  const text = fs.readFileSync(file, 'utf8');
  const imports = {};
  for (const match of text.matchAll(/import \{ (\w+) \} from "([^"]+)";/g)) {
    const from = match[2];
    imports[match[1]] = from.startsWith('.') ? path.resolve(path.dirname(file), from) + '.d.ts'
                                             : path.join(NODE_MODULES, from) + '.d.ts';
  }
  const start = text.search(/export interface \w+( extends \w+)? \{/);
  const result = { props: start < 0 ? null : parseBody(text, text.indexOf('{', start) + 1).props,
                   imports };
  declarations.set(file, result);
  return result;
}

// Parses `"name"?: type;` entries up to the closing brace; returns them and where it ended.
function parseBody(text, position) {
  const props = {};
  let i = position;
  for (;;) {
    while (/\s/.test(text[i])) i++;
    if (text.startsWith('/*', i)) {
      i = text.indexOf('*/', i) + 2;
      continue;
    }
    if (text.startsWith('//', i)) {
      i = text.indexOf('\n', i);
      continue;
    }
    if (text[i] === '}') return { props, end: i + 1 };
    const match = /^"([^"]+)"\??:\s*/.exec(text.slice(i, i + 200));
    if (!match) throw new Error(`cannot read a declaration at: ${text.slice(i, i + 60)}`);
    i += match[0].length;
    let depth = 0;
    const typeStart = i;
    for (; !(depth === 0 && text[i] === ';'); i++) {
      if ('{<('.includes(text[i])) depth++;
      if ('}>)'.includes(text[i])) depth--;
    }
    props[match[1]] = text.slice(typeStart, i).trim();
    i++;
  }
}

// Every field of `value` that the type `type` (declared in `file`) does not have.
function unknownFields(value, type, file, where, found) {
  if (value === null || typeof value !== 'object') return;
  type = type.trim();
  const array = /^Array<([\s\S]*)>$/.exec(type);
  if (array) {
    if (Array.isArray(value)) value.forEach((item, i) => unknownFields(item, array[1], file, `${where}[${i}]`, found));
    return;
  }
  let props = null;
  let declaredIn = file;
  if (/^\{\s*\[key: string\]/.test(type)) return;  // a map: any key
  if (type.startsWith('{')) {
    props = parseBody(type, 1).props;
  } else if (/^I\w+$/.test(type)) {
    const target = parseDeclaration(file).imports[type];
    if (!target || !fs.existsSync(target)) return;
    props = parseDeclaration(target).props;
    declaredIn = target;
  }
  if (!props || Array.isArray(value)) return;
  for (const [key, child] of Object.entries(value)) {
    if (!(key in props)) {
      found.push(`${where}.${key}`);
    } else {
      unknownFields(child, props[key], declaredIn, `${where}.${key}`, found);
    }
  }
}

function validateAs(model, object, where) {
  const module = MODELS[model];
  assert.ok(module, `${where}: no schema for ${model} in this test; add it to MODELS`);
  const Model = load(module)[path.basename(module)];
  try {
    new Model(object).validate();
  } catch (error) {
    assert.fail(`${where} (${model}) does not validate against Kubernetes' schema: ${error.message}`);
  }
  const declaration = load.resolve(module).replace(/\.js$/, '.d.ts');
  const found = [];
  const iface = `I${path.basename(module)}`;
  unknownFields(object, '{' + Object.entries(parseDeclaration(declaration).props)
      .map(([k, v]) => `"${k}"?: ${v};`).join(' ') + '}', declaration, where, found);
  assert.deepEqual(found, [], `${where} (${iface}) has fields Kubernetes does not know`);
}

function validate(object, where) {
  validateAs(`${object.apiVersion}/${object.kind}`, object, `${where} ${object.kind}/${object.metadata.name}`);
}

// `kubectl kustomize`, with generated names' hash suffixes taken off; null without kubectl.
function kubectlKustomize(dir, generatedNames) {
  const run = childProcess.spawnSync('kubectl', ['kustomize', dir], { encoding: 'utf8' });
  if (run.error && run.error.code === 'ENOENT') return null;
  assert.equal(run.status, 0, `kubectl kustomize ${dir} failed: ${run.stderr}`);
  const strip = (value) => {
    if (typeof value === 'string') {
      for (const name of generatedNames) if (new RegExp(`^${name}-[a-z0-9]{10}$`).test(value)) return name;
      return value;
    }
    if (Array.isArray(value)) return value.map(strip);
    if (value && typeof value === 'object') return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, strip(v)]));
    return value;
  };
  return YAML.parseAllDocuments(run.stdout).map((doc) => strip(doc.toJS()));
}

const byKindAndName = (a, b) => `${a.kind}/${a.metadata.name}`.localeCompare(`${b.kind}/${b.metadata.name}`);

const ROLE_BINARY = { chief: 'stratum-coordinator', worker: 'stratum-worker', ps: 'stratum-ps' };


function runBinary(binary, args, env) {
  const run = childProcess.spawnSync(path.join(BIN, binary), args,
    { encoding: 'utf8', env: { PATH: process.env.PATH, ...env }, timeout: 20000 });
  assert.ok(!run.error, `${binary}: ${run.error}`);
  return run;
}

function printedTfConfig(binary, args, env, where) {
  const run = runBinary(binary, [...args, '--print_tf_config'], env);
  assert.equal(run.status, 0, `${where}: ${binary} ${args.join(' ')} --print_tf_config failed: ${run.stdout}${run.stderr}`);
  return JSON.parse(run.stdout);
}

function dockerfileBinaries() {
  const text = fs.readFileSync(path.join(SOURCE, 'deploy', 'docker', 'Dockerfile'), 'utf8').replace(/\\\n/g, ' ');
  const copied = new Set();
  for (const line of text.split('\n')) {
    const words = line.trim().split(/\s+/);
    if (words[0] !== 'COPY' || words[1] !== '--from=build') continue;
    const destination = words[words.length - 1];
    for (const source of words.slice(2, -1)) copied.add(path.join(destination, path.basename(source)));
  }
  return copied;
}

const GRACE_SECONDS = 3;  // the binaries' --shutdown_grace default

// Everything that must agree within one rendering.
function checkConsistency(objects, where, { tls = false, gpu = false } = {}) {
  const cluster = find(objects, 'ConfigMap', 'stratum-cluster').data;
  const port = Number(cluster.STRATUM_K8S_PORT);
  const healthPort = Number(cluster.STRATUM_HEALTH_PORT);
  const prefix = cluster.STRATUM_K8S_NAME_PREFIX;
  const binaries = dockerfileBinaries();
  const images = new Set();
  const workloads = objects.filter((o) => o.kind === 'StatefulSet' || o.kind === 'Job');
  assert.deepEqual(workloads.map((o) => o.metadata.labels['app.kubernetes.io/component']).sort(),
                   ['chief', 'ps', 'worker'], `${where}: one workload per role`);
  for (const workload of workloads) {
    const role = workload.metadata.labels['app.kubernetes.io/component'];
    const name = workload.metadata.name;
    const spec = podSpec(workload);
    const container = containerOf(workload);
    const at = `${where} ${workload.kind}/${name}`;
    assert.equal(name, `${prefix}-${role}`, `${at}: named <prefix>-<role>`);
    const replicas = workload.kind === 'Job' ? 1 : workload.spec.replicas;
    assert.equal(cluster[`STRATUM_K8S_${role.toUpperCase()}_REPLICAS`], String(replicas),
                 `${at}: the ConfigMap's replica count is the workload's`);
    // Its Service: headless, publishing not-ready pods, selecting exactly this workload.
    const serviceName = workload.kind === 'Job' ? spec.subdomain : workload.spec.serviceName;
    assert.equal(serviceName, name, `${at}: its Service has its name`);
    const service = find(objects, 'Service', serviceName);
    assert.equal(service.spec.clusterIP, 'None', `${at}: the Service is headless`);
    assert.equal(service.spec.publishNotReadyAddresses, true, `${at}: peers resolve starting pods`);
    const labels = workload.spec.template.metadata.labels;
    for (const [key, value] of Object.entries(service.spec.selector)) assert.equal(labels[key], value, `${at}: Service selector ${key}`);
    for (const other of workloads.filter((o) => o !== workload)) {
      const otherLabels = other.spec.template.metadata.labels;
      assert.ok(Object.entries(service.spec.selector).some(([k, v]) => otherLabels[k] !== v),
                `${at}: Service ${serviceName} also selects ${other.metadata.name}`);
    }
    if (workload.kind === 'StatefulSet') {
      for (const [key, value] of Object.entries(workload.spec.selector.matchLabels)) assert.equal(labels[key], value, `${at}: selector ${key}`);
    } else {
      assert.equal(spec.hostname, `${name}-0`, `${at}: the chief's hostname is its task's pod name`);
    }
    // Ports: the Service's target is the container's grpc port, the TF_CONFIG port.
    const grpc = container.ports.find((p) => p.name === service.spec.ports[0].targetPort);
    assert.ok(grpc, `${at}: no container port ${service.spec.ports[0].targetPort}`);
    assert.equal(grpc.containerPort, port, `${at}: container port is STRATUM_K8S_PORT`);
    assert.equal(service.spec.ports[0].port, port, `${at}: Service port is STRATUM_K8S_PORT`);
    // Probes: native gRPC, on the plaintext health port.
    assert.equal(container.ports.find((p) => p.name === 'health').containerPort, healthPort, `${at}: health port`);
    for (const probe of ['readinessProbe', 'livenessProbe']) {
      assert.equal(container[probe]?.grpc?.port, healthPort, `${at}: ${probe} is a gRPC probe on ${healthPort}`);
    }
    assert.ok(spec.terminationGracePeriodSeconds > GRACE_SECONDS, `${at}: grace period`);
    assert.ok(container.resources.requests.cpu && container.resources.requests.memory, `${at}: requests`);
    assert.equal(Boolean(container.resources.limits?.['nvidia.com/gpu']), gpu && role === 'worker', `${at}: GPUs`);
    // The binary is the role's, where the Dockerfile puts it.
    assert.deepEqual(container.command, [`/usr/local/bin/${ROLE_BINARY[role]}`], `${at}: command`);
    assert.ok(binaries.has(container.command[0]), `${at}: the Dockerfile copies no ${container.command[0]}`);
    images.add(container.image);
    assert.equal(spec.securityContext.runAsNonRoot, true, `${at}: non-root`);
    // Volumes: every claim and ConfigMap mounted exists.
    for (const volume of spec.volumes || []) {
      if (volume.persistentVolumeClaim) find(objects, 'PersistentVolumeClaim', volume.persistentVolumeClaim.claimName);
      if (volume.configMap) find(objects, 'ConfigMap', volume.configMap.name);
    }
    const mounts = Object.fromEntries((container.volumeMounts || []).map((m) => [m.name, m.mountPath]));
    if (tls) {
      const secret = spec.volumes.find((v) => v.name === 'tls' && v.secret);
      assert.ok(secret, `${at}: mounts no TLS Secret`);
      const env = podEnvironment(objects, container, { name: 'pod', index: 0 });
      assert.equal(env.STRATUM_TLS_CERT, `${mounts.tls}/tls.crt`, `${at}: certificate path`);
      assert.equal(env.STRATUM_TLS_KEY, `${mounts.tls}/tls.key`, `${at}: key path`);
      assert.equal(env.STRATUM_TLS_CA, `${mounts.tls}/ca.crt`, `${at}: CA path`);
      assert.ok(env.STRATUM_TLS_SERVER_NAME, `${at}: server name`);
    }
    if (role !== 'worker') {
      assert.ok(mounts.checkpoints, `${at}: mounts the checkpoint volume`);
    }
  }
  assert.equal(images.size, 1, `${where}: one image for every role (${[...images]})`);
  // The chief trains the job of the ConfigMap and checkpoints on the volume the ps share.
  const chief = workloads.find((o) => o.kind === 'Job');
  const chiefContainer = containerOf(chief);
  const jobArg = chiefContainer.args.find((a) => a.startsWith('--job='));
  const jobVolume = podSpec(chief).volumes.find((v) => v.configMap && v.configMap.name === 'stratum-job');
  const jobMount = chiefContainer.volumeMounts.find((m) => m.name === jobVolume.name);
  assert.equal(jobArg, `--job=${jobMount.mountPath}/job.json`, `${where}: --job is the ConfigMap's job.json`);
  const job = JSON.parse(find(objects, 'ConfigMap', 'stratum-job').data['job.json']);
  const checkpointMounts = new Set();
  for (const workload of workloads.filter((o) => o.metadata.labels['app.kubernetes.io/component'] !== 'worker')) {
    const spec = podSpec(workload);
    const volume = spec.volumes.find((v) => v.persistentVolumeClaim);
    const mount = containerOf(workload).volumeMounts.find((m) => m.name === volume.name);
    checkpointMounts.add(`${volume.persistentVolumeClaim.claimName}:${mount.mountPath}`);
    assert.ok(job.checkpoint.dir.startsWith(mount.mountPath + '/'), `${where}: checkpoint.dir is on the volume`);
  }
  assert.equal(checkpointMounts.size, 1, `${where}: the chief and every ps share one checkpoint volume`);
  const pvc = find(objects, 'PersistentVolumeClaim', [...checkpointMounts][0].split(':')[0]);
  assert.deepEqual(pvc.spec.accessModes, ['ReadWriteMany'], `${where}: the checkpoint volume is shared`);
}

// Runs every pod's binary with --print_tf_config; the cluster they print must be the
// same for all, list every pod at its Kubernetes DNS name, and name each pod's task.
function checkTfConfigs(objects, where, { tls = false } = {}) {
  const pods = podsOf(objects);
  const expected = {};
  for (const pod of pods) {
    const port = containerOf(pod.object).ports.find((p) => p.name === 'grpc').containerPort;
    (expected[pod.role] ||= [])[pod.index] = `${pod.dns}:${port}`;
  }
  for (const pod of pods) {
    const container = containerOf(pod.object);
    const env = podEnvironment(objects, container, pod);
    const binary = path.basename(container.command[0]);
    const printed = printedTfConfig(binary, container.args || [], env, `${where} pod ${pod.name}`);
    assert.deepEqual(printed.cluster, expected, `${where} pod ${pod.name}: cluster`);
    assert.deepEqual(printed.task, { type: pod.role, index: pod.index }, `${where} pod ${pod.name}: task`);
    assert.equal(printed.rpc_layer, tls ? 'grpc+tls' : undefined, `${where} pod ${pod.name}: rpc_layer`);
  }
  return pods;
}

// ---------------------------------------------------------------------------------------

const RENDERINGS = [
  { dir: 'base' },
  { dir: 'overlays/cpu' },
  { dir: 'overlays/gpu', gpu: true },
  { dir: 'overlays/cpu-tls', tls: true },
  { dir: 'mwms', mwms: true },
];

// The MultiWorkerMirrored job: an Indexed Job of workers, each training the ConfigMap's job
// in lock-step, checkpointing to the volume they all mount.
function checkMwmsConsistency(objects, where) {
  const cluster = find(objects, 'ConfigMap', 'stratum-cluster').data;
  const workers = find(objects, 'Job', `${cluster.STRATUM_K8S_NAME_PREFIX}-worker`);
  const at = `${where} Job/${workers.metadata.name}`;
  assert.equal(workers.spec.completionMode, 'Indexed', `${at}: one pod per index`);
  assert.equal(workers.spec.parallelism, workers.spec.completions, `${at}: all workers at once`);
  assert.equal(cluster.STRATUM_K8S_WORKER_REPLICAS, String(workers.spec.completions), `${at}: replicas`);
  assert.equal(cluster.STRATUM_K8S_PS_REPLICAS, '0', `${at}: no ps`);
  assert.equal(cluster.STRATUM_K8S_CHIEF_REPLICAS, '0', `${at}: no chief`);
  const spec = podSpec(workers);
  const service = find(objects, 'Service', spec.subdomain);
  assert.equal(service.spec.clusterIP, 'None', `${at}: the Service is headless`);
  assert.equal(service.spec.publishNotReadyAddresses, true, `${at}: peers resolve starting pods`);
  const container = containerOf(workers);
  assert.deepEqual(container.command, ['/usr/local/bin/stratum-worker'], `${at}: command`);
  assert.ok(dockerfileBinaries().has(container.command[0]), `${at}: the Dockerfile copies it`);
  const mounts = Object.fromEntries(container.volumeMounts.map((m) => [m.name, m.mountPath]));
  assert.ok(container.args.includes(`--job=${mounts.job}/job.json`), `${at}: --job is the ConfigMap's`);
  const job = JSON.parse(find(objects, 'ConfigMap', 'stratum-job').data['job.json']);
  assert.equal(job.strategy.type, 'multi_worker_mirrored', `${at}: the job's strategy`);
  assert.ok(job.checkpoint.dir.startsWith(mounts.checkpoints + '/'), `${at}: checkpoint.dir is on the volume`);
  for (const probe of ['readinessProbe', 'livenessProbe']) {
    assert.equal(container[probe]?.grpc?.port, Number(cluster.STRATUM_HEALTH_PORT), `${at}: ${probe}`);
  }
}

for (const rendering of RENDERINGS) {
  test(`kustomization ${rendering.dir}`, async (t) => {
    const dir = path.join(K8S, rendering.dir);
    const objects = render(dir);
    await t.test('validates against the Kubernetes schemas', () => {
      for (const object of objects) validate(object, rendering.dir);
    });
    await t.test('matches kubectl kustomize', (t2) => {
      const generated = objects.filter((o) => o.kind === 'ConfigMap').map((o) => o.metadata.name);
      const real = kubectlKustomize(dir, generated);
      if (real === null) {
        t2.skip('kubectl is not installed: checked with this test\'s renderer only');
        return;
      }
      assert.deepEqual([...objects].sort(byKindAndName), real.sort(byKindAndName));
    });
    await t.test('names, ports and replica counts agree', () => (rendering.mwms
      ? checkMwmsConsistency(objects, rendering.dir) : checkConsistency(objects, rendering.dir, rendering)));
    await t.test('every pod computes the same cluster and its own task', () => {
      const pods = checkTfConfigs(objects, rendering.dir, rendering);
      console.log(`# ${rendering.dir}: ${pods.map((p) => `${p.name}=${p.role}:${p.index}`).join(' ')}`);
    });
  });
}

test('scaling a role is one number in the overlay', () => {
  const copy = fs.mkdtempSync(path.join(os.tmpdir(), 'stratum-k8s-'));
  try {
    fs.cpSync(K8S, copy, { recursive: true });
    const file = path.join(copy, 'overlays', 'cpu', 'kustomization.yaml');
    const k = YAML.parse(fs.readFileSync(file, 'utf8'));
    k.replicas.find((r) => r.name === 'stratum-worker').count = 5;
    k.replicas.find((r) => r.name === 'stratum-ps').count = 1;
    fs.writeFileSync(file, YAML.stringify(k));
    for (const overlay of ['cpu', 'cpu-tls']) {
      const objects = render(path.join(copy, 'overlays', overlay));
      checkConsistency(objects, `scaled ${overlay}`, { tls: overlay === 'cpu-tls' });
      const pods = checkTfConfigs(objects, `scaled ${overlay}`, { tls: overlay === 'cpu-tls' });
      assert.equal(pods.filter((p) => p.role === 'worker').length, 5);
      assert.equal(pods.filter((p) => p.role === 'ps').length, 1);
      const real = kubectlKustomize(path.join(copy, 'overlays', overlay), ['stratum-cluster', 'stratum-job']);
      if (real) assert.equal(find(real, 'ConfigMap', 'stratum-cluster').data.STRATUM_K8S_WORKER_REPLICAS, '5');
    }
  } finally {
    fs.rmSync(copy, { recursive: true, force: true });
  }
});

test('the job spec is the example PS job, checkpointing to the volume', () => {
  const example = JSON.parse(fs.readFileSync(path.join(SOURCE, 'examples', 'fashion_mnist_ps.json'), 'utf8'));
  const job = JSON.parse(fs.readFileSync(path.join(K8S, 'base', 'job.json'), 'utf8'));
  assert.ok(job.checkpoint.dir.startsWith('/var/lib/stratum/checkpoints/'));
  example.checkpoint.dir = job.checkpoint.dir;
  assert.deepEqual(job, example);
});

// ---------------------------------------------------------------------------------------
// tfjob.yaml

const TFJOB_ROLES = { Chief: 'chief', PS: 'ps', Worker: 'worker' };

// The TF_CONFIG Kubeflow's operator writes (pkg/controller.v1/tensorflow/tensorflow.go):
// Go's encoding/json of {cluster (keys sorted), task, environment "cloud"}, each task at
// <job>-<type>-<i>.<namespace>.svc:<port of "tfjob-port" in container "tensorflow">.
function operatorTfConfig(tfjob, type, index) {
  const cluster = {};
  for (const [replicaType, spec] of Object.entries(tfjob.spec.tfReplicaSpecs).sort(([a], [b]) => a.toLowerCase().localeCompare(b.toLowerCase()))) {
    const rt = replicaType.toLowerCase();
    const container = spec.template.spec.containers.find((c) => c.name === 'tensorflow');
    const port = container.ports.find((p) => p.name === 'tfjob-port').containerPort;
    cluster[rt] = Array.from({ length: spec.replicas }, (_, i) => `${tfjob.metadata.name}-${rt}-${i}.${NAMESPACE}.svc:${port}`);
  }
  return JSON.stringify({ cluster, task: { type, index }, environment: 'cloud' });
}

test('tfjob.yaml', async (t) => {
  const objects = readYamlDocuments(path.join(K8S, 'tfjob.yaml'));
  const tfjob = objects.find((o) => o.kind === 'TFJob');
  await t.test('validates: its ConfigMap and claim, and the TFJob with each pod template', () => {
    for (const object of objects.filter((o) => o !== tfjob)) validate(object, 'tfjob.yaml');
    assert.equal(tfjob.apiVersion, 'kubeflow.org/v1');
    for (const key of Object.keys(tfjob.spec)) assert.ok(['runPolicy', 'tfReplicaSpecs', 'successPolicy', 'enableDynamicWorker'].includes(key), `TFJob spec.${key}`);
    for (const key of Object.keys(tfjob.spec.runPolicy || {})) {
      assert.ok(['cleanPodPolicy', 'ttlSecondsAfterFinished', 'activeDeadlineSeconds', 'backoffLimit', 'schedulingPolicy', 'suspend', 'managedBy'].includes(key), `TFJob runPolicy.${key}`);
    }
    assert.ok(['None', 'Running', 'All', undefined].includes(tfjob.spec.runPolicy?.cleanPodPolicy));
    assert.deepEqual(Object.keys(tfjob.spec.tfReplicaSpecs).sort(), ['Chief', 'PS', 'Worker']);
    for (const [type, spec] of Object.entries(tfjob.spec.tfReplicaSpecs)) {
      for (const key of Object.keys(spec)) assert.ok(['replicas', 'restartPolicy', 'template'].includes(key), `${type}.${key}`);
      assert.ok(['Always', 'OnFailure', 'Never', 'ExitCode'].includes(spec.restartPolicy), `${type}.restartPolicy`);
      assert.ok(Number.isInteger(spec.replicas) && spec.replicas > 0, `${type}.replicas`);
      validateAs('v1/PodTemplateSpec', spec.template, `tfjob.yaml ${type}.template`);
      const container = spec.template.spec.containers.find((c) => c.name === 'tensorflow');
      assert.ok(container, `${type}: the operator needs a container named "tensorflow"`);
      assert.deepEqual(container.ports.find((p) => p.name === 'tfjob-port'), { name: 'tfjob-port', containerPort: 2222 });
    }
  });
  await t.test('agrees with the plain manifests', () => {
    const plain = render(path.join(K8S, 'overlays', 'cpu'));
    const jobConfigMap = objects.find((o) => o.kind === 'ConfigMap');
    assert.deepEqual(JSON.parse(jobConfigMap.data['job.json']), JSON.parse(fs.readFileSync(path.join(K8S, 'base', 'job.json'), 'utf8')));
    for (const [type, role] of Object.entries(TFJOB_ROLES)) {
      const spec = tfjob.spec.tfReplicaSpecs[type];
      const workload = plain.find((o) => (o.kind === 'StatefulSet' || o.kind === 'Job') && o.metadata.labels['app.kubernetes.io/component'] === role);
      const mine = containerOf(workload);
      const theirs = spec.template.spec.containers[0];
      assert.equal(spec.replicas, workload.kind === 'Job' ? 1 : workload.spec.replicas, `${type}: replicas`);
      assert.deepEqual(theirs.command, mine.command, `${type}: command`);
      assert.deepEqual(theirs.args, mine.args, `${type}: args`);
      assert.equal(theirs.image, mine.image, `${type}: image`);
      assert.deepEqual(theirs.resources, mine.resources, `${type}: resources`);
      assert.deepEqual(theirs.readinessProbe, mine.readinessProbe, `${type}: readiness probe`);
      assert.deepEqual(theirs.livenessProbe, mine.livenessProbe, `${type}: liveness probe`);
      assert.equal(theirs.env.find((e) => e.name === 'STRATUM_HEALTH_PORT').value, String(theirs.readinessProbe.grpc.port));
      assert.deepEqual(theirs.volumeMounts.map((m) => m.mountPath).sort(), mine.volumeMounts.map((m) => m.mountPath).sort(), `${type}: mounts`);
      assert.equal(spec.template.spec.terminationGracePeriodSeconds, podSpec(workload).terminationGracePeriodSeconds, `${type}: grace`);
      for (const volume of spec.template.spec.volumes) {
        if (volume.configMap) assert.equal(volume.configMap.name, jobConfigMap.metadata.name);
        if (volume.persistentVolumeClaim) assert.ok(objects.find((o) => o.kind === 'PersistentVolumeClaim' && o.metadata.name === volume.persistentVolumeClaim.claimName));
      }
    }
  });
  await t.test('every pod accepts the TF_CONFIG the operator writes', () => {
    for (const [type, role] of Object.entries(TFJOB_ROLES)) {
      const spec = tfjob.spec.tfReplicaSpecs[type];
      const container = spec.template.spec.containers[0];
      for (let index = 0; index < spec.replicas; index++) {
        const tfConfig = operatorTfConfig(tfjob, role, index);
        const env = Object.fromEntries(container.env.map((e) => [e.name, e.value]));
        const printed = printedTfConfig(path.basename(container.command[0]), container.args, { ...env, TF_CONFIG: tfConfig }, `TFJob ${type} ${index}`);
        const written = JSON.parse(tfConfig);
        assert.deepEqual(printed.cluster, written.cluster, `TFJob ${type} ${index}: cluster`);
        assert.deepEqual(printed.task, written.task, `TFJob ${type} ${index}: task`);
      }
    }
  });
});
