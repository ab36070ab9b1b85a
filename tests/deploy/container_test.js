// The container image run for real: the pods of deploy/k8s as containers on a Docker
// network, each started as its manifest describes it (container_cluster.js): the
// parameter-server job of overlays/cpu, the same under mutual TLS (overlays/cpu-tls), and
// the MultiWorkerMirrored job of mwms. They train Fashion-MNIST to the usual accuracy; the
// gRPC probes the manifests declare answer; a killed ps and a killed worker, restarted as a
// pod's restartPolicy would, are survived; `docker stop` of the whole job (SIGTERM, then
// SIGKILL after the grace period) leaves a checkpoint the job resumes from; a client without
// the cluster's CA is refused.
//
//   node container_test.js --source DIR --node-modules DIR
// Needs a Docker engine and the manifests' image (the CTest fixtures container_engine and
// container_image). Without an engine every test skips, saying why; under CI=true it fails.
'use strict';

const assert = require('node:assert/strict');
const childProcess = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { test } = require('node:test');
const { createRequire } = require('node:module');
const { ContainerCluster, docker, engineProblem } = require('./container_cluster');

function option(name) {
  const index = process.argv.indexOf(name);
  if (index < 0 || index + 1 >= process.argv.length) {
    console.error(`container_test.js: missing ${name} DIR`);
    process.exit(2);
  }
  return path.resolve(process.argv[index + 1]);
}

const SOURCE = option('--source');
const NODE_MODULES = option('--node-modules');
const K8S = path.join(SOURCE, 'deploy', 'k8s');
const YAML = createRequire(path.join(NODE_MODULES, '..', 'package.json'))('yaml');
const k8s = require('./k8s_render')({ YAML, namespace: 'stratum-test' });

// Fashion-MNIST's reference model after 10 epochs: 0.86 to 0.88 on bare processes.
const MIN_ACCURACY = 0.84;
const JOB_MS = 240000;

const problem = engineProblem();
if (problem && process.env.CI === 'true') {
  console.error(`container_test.js: ${problem}, and CI=true needs the container tests: start dockerd`);
  process.exit(1);
}
const skip = problem ? `${problem}: start one (dockerd) to run the container tests` : false;

function imageProblem(image) {
  const run = docker(['image', 'inspect', image], { check: false });
  return run.status === 0 ? null : `the image ${image} is not built: run deploy/docker/build.sh`;
}

async function withCluster(dir, label, options, body) {
  const objects = k8s.render(path.join(K8S, dir));
  const cluster = new ContainerCluster(k8s, objects, { label, ...options });
  try {
    const missing = imageProblem(cluster.image);
    assert.equal(missing, null, missing);
    await body(cluster);
  } finally {
    cluster.cleanup();
  }
}

const PS_PODS = ['stratum-ps-0', 'stratum-ps-1', 'stratum-worker-0', 'stratum-worker-1', 'stratum-chief-0'];

function summaryOf(cluster) {
  const text = cluster.readVolumeFile('stratum-checkpoints', 'summary.json');
  assert.ok(text, 'the chief wrote no summary.json on the checkpoint volume');
  return JSON.parse(text);
}

function checkTrained(cluster, chief, where) {
  const summary = summaryOf(cluster);
  assert.ok(summary.test_accuracy >= MIN_ACCURACY,
    `${where}: test accuracy ${summary.test_accuracy} < ${MIN_ACCURACY}\n${cluster.logs(chief).slice(-2000)}`);
  console.log(`# ${where}: test accuracy ${summary.test_accuracy}, ${Math.round(summary.examples_per_sec)} examples/s, ` +
              `${summary.wall_s.toFixed(1)} s`);
  return summary;
}

// Starts the PS job's pods (ps and workers first, as a StatefulSet's come up before a Job
// that waits for them) and waits until every readiness probe answers SERVING.
async function startPsJob(cluster) {
  for (const name of PS_PODS) cluster.start(name);
  const ms = await cluster.waitUntilServing(PS_PODS, 120000);
  console.log(`# every pod SERVING ${ms} ms after the probes began`);
}

test('the parameter-server job trains in containers from overlays/cpu, every probe SERVING', { skip }, async () => {
  await withCluster('overlays/cpu', 'ps', {}, async (cluster) => {
    await startPsJob(cluster);
    assert.equal(await cluster.waitForExit('stratum-chief-0', JOB_MS), 0, cluster.logs('stratum-chief-0'));
    const summary = checkTrained(cluster, 'stratum-chief-0', 'ps job in containers');
    assert.equal(summary.num_workers, 2);
    assert.equal(summary.num_ps, 2);
    // The chief's log names every task at its Kubernetes DNS name.
    assert.match(cluster.logs('stratum-chief-0'), /ps:1\s+stratum-ps-1\.stratum-ps\.stratum-test\.svc:2222\s+SERVING/);
    // The ps and workers serve on after the job; their probes still answer.
    for (const name of PS_PODS.slice(0, 4)) assert.equal(cluster.probe(name), null, `${name}'s probe`);
  });
});

test('a killed ps and a killed worker, restarted as the kubelet would, are survived', { skip }, async () => {
  await withCluster('overlays/cpu', 'kill', {}, async (cluster) => {
    await startPsJob(cluster);
    await cluster.waitForLog('stratum-chief-0', /Epoch 2\/10/, JOB_MS);
    cluster.kill('stratum-ps-1');
    cluster.restart('stratum-ps-1');
    await cluster.waitForLog('stratum-chief-0', /Epoch 5\/10/, JOB_MS);
    cluster.kill('stratum-worker-0');
    cluster.restart('stratum-worker-0');
    assert.equal(await cluster.waitForExit('stratum-chief-0', JOB_MS), 0, cluster.logs('stratum-chief-0'));
    const log = cluster.logs('stratum-chief-0');
    for (const line of log.split('\n').filter((l) => / W |unavailable|re-seeded|retried|restarted/.test(l))) {
      console.log(`# chief: ${line}`);
    }
    // Found by a worker's step or by a checkpoint's save, whichever came first.
    assert.match(log, /a parameter server is unavailable: (ps:1|the checkpoint at step \d+ was not saved: ps:1)|ps:1\b.*restarted/,
      'the chief saw ps:1 go');
    assert.match(log, /worker:0 at \S+ is down|retried on other workers/, 'the chief saw worker:0 go');
    checkTrained(cluster, 'stratum-chief-0', 'ps job with a ps and a worker killed');
    assert.equal(cluster.probe('stratum-ps-1'), null, 'the restarted ps serves');
    assert.equal(cluster.probe('stratum-worker-0'), null, 'the restarted worker serves');
  });
});

test('docker stop of the whole job leaves a checkpoint that the job resumes from', { skip }, async () => {
  await withCluster('overlays/cpu', 'stop', {}, async (cluster) => {
    await startPsJob(cluster);
    await cluster.waitForLog('stratum-chief-0', /Epoch 3\/10/, JOB_MS);
    cluster.stop(PS_PODS);
    const chiefExit = cluster.state('stratum-chief-0').exitCode;
    console.log(`# after docker stop, the exit codes: ${PS_PODS.map((n) => `${n} ${cluster.state(n).exitCode}`).join(', ')}`);
    assert.notEqual(chiefExit, 137, `the chief was killed before its grace period ran out:\n${cluster.logs('stratum-chief-0')}`);
    const checkpoints = cluster.listVolume('stratum-checkpoints', 'fashion-mnist');
    assert.ok(checkpoints.some((f) => /^ckpt-\d+$/.test(f)), `no checkpoint on the volume: ${checkpoints}`);
    // Every container starts again, as the pods would be rescheduled.
    for (const name of PS_PODS) cluster.restart(name);
    assert.equal(await cluster.waitForExit('stratum-chief-0', JOB_MS), 0, cluster.logs('stratum-chief-0'));
    const log = cluster.logs('stratum-chief-0');
    const resumed = log.match(/resumed from the checkpoint at step (\d+)/);
    assert.ok(resumed, `the chief did not resume:\n${log.slice(-3000)}`);
    assert.ok(Number(resumed[1]) >= 938 * 2, `resumed at step ${resumed[1]}, before the stop`);
    checkTrained(cluster, 'stratum-chief-0', `ps job stopped and resumed from step ${resumed[1]}`);
  });
});

test('under mutual TLS (overlays/cpu-tls) the job trains and a client without the CA is refused', { skip }, async () => {
  const certs = fs.mkdtempSync(path.join(os.tmpdir(), 'stratum-container-certs-'));
  try {
    const make = (dir) => {
      const run = childProcess.spawnSync('bash', [path.join(SOURCE, 'deploy', 'make_tls_certs.sh'), dir],
        { encoding: 'utf8' });
      assert.equal(run.status, 0, run.stderr);
      return Object.fromEntries(['tls.crt', 'tls.key', 'ca.crt'].map((f) => [f, fs.readFileSync(path.join(dir, f))]));
    };
    const secret = make(path.join(certs, 'cluster'));
    const foreign = make(path.join(certs, 'foreign'));
    await withCluster('overlays/cpu-tls', 'tls', { secrets: { 'stratum-tls': secret } }, async (cluster) => {
      await startPsJob(cluster);
      assert.equal(await cluster.waitForExit('stratum-chief-0', JOB_MS), 0, cluster.logs('stratum-chief-0'));
      checkTrained(cluster, 'stratum-chief-0', 'ps job under mutual TLS in containers');
      assert.match(cluster.logs('stratum-ps-0'), /with mutual TLS/);
      // Clients of ps-0's gRPC port, next to the pods, with the environment of the manifests'
      // TLS component: the cluster's certificates get in; another CA's and none do not.
      const address = '--address=stratum-ps-0.stratum-ps.stratum-test.svc:2222';
      const env = k8s.podEnvironment(cluster.objects, k8s.containerOf(cluster.pod('stratum-worker-0').object),
        cluster.pod('stratum-worker-0'));
      const tlsEnv = Object.entries(env).filter(([k]) => k.startsWith('STRATUM_TLS_')).flatMap(([k, v]) => ['-e', `${k}=${v}`]);
      const client = (files) => {
        const dir = cluster.files(`client-${Date.now()}-${Math.random().toString(36).slice(2)}`, files, 0o444, 0);
        return cluster.runClient([...tlsEnv, '--mount', `type=bind,src=${dir},dst=/etc/stratum/tls,readonly`],
          ['stratum-health', address, '--timeout=5s']);
      };
      const member = client(secret);
      assert.equal(member.status, 0, `the cluster's own certificate is refused: ${member.stderr}`);
      const outsider = client(foreign);
      assert.equal(outsider.status, 1, `a certificate of another CA got in: ${outsider.stdout}`);
      assert.match(outsider.stderr, /certificate/, outsider.stderr);
      const plaintext = cluster.runClient([], ['stratum-health', address, '--timeout=5s']);
      assert.equal(plaintext.status, 1, `a plaintext client got in: ${plaintext.stdout}`);
      console.log(`# another CA's client: ${outsider.stderr.trim()}`);
      console.log(`# a plaintext client: ${plaintext.stderr.trim()}`);
    });
  } finally {
    fs.rmSync(certs, { recursive: true, force: true });
  }
});

test('the MultiWorkerMirrored job of deploy/k8s/mwms trains in containers', { skip }, async () => {
  await withCluster('mwms', 'mwms', {}, async (cluster) => {
    const workers = cluster.pods.map((p) => p.name);
    assert.deepEqual(workers, ['stratum-worker-0', 'stratum-worker-1']);
    cluster.startAll();
    // Their readiness probes answer while they train.
    await cluster.waitUntilServing(workers, 60000);
    for (const name of workers) {
      assert.equal(await cluster.waitForExit(name, JOB_MS), 0, cluster.logs(name));
    }
    const summary = checkTrained(cluster, 'stratum-worker-0', 'MultiWorkerMirrored job in containers');
    assert.equal(summary.num_workers, 2);
  });
});

function composeProblem() {
  const run = childProcess.spawnSync('docker-compose', ['version'], { encoding: 'utf8' });
  if (!run.error && run.status === 0) return null;
  const why = 'docker-compose is missing (apt-get install docker-compose)';
  if (process.env.CI === 'true' && !problem) {
    console.error(`container_test.js: ${why}, and CI=true needs the compose test`);
    process.exit(1);
  }
  return why;
}

test('deploy/compose.yaml runs the parameter-server job with an evaluator, every healthcheck healthy',
  { skip: skip || composeProblem() || false }, async () => {
    const project = `stratum-ct-${process.pid}-compose`;
    const compose = (args, timeout = 180000) => {
      const run = childProcess.spawnSync('docker-compose', ['-p', project, '-f', path.join(SOURCE, 'deploy', 'compose.yaml'), ...args],
        { encoding: 'utf8', timeout });
      assert.ok(!run.error, `docker-compose ${args[0]}: ${run.error}`);
      assert.equal(run.status, 0, `docker-compose ${args.join(' ')} failed: ${run.stderr}`);
      return run.stdout;
    };
    const id = (service) => compose(['ps', '-q', service]).trim();
    try {
      compose(['up', '-d']);
      const chief = id('stratum-chief-0');
      const deadline = Date.now() + JOB_MS;
      let state;
      do {
        state = docker(['inspect', '--format', '{{.State.Status}} {{.State.ExitCode}}', chief]).stdout.trim();
        if (state.startsWith('exited') || Date.now() > deadline) break;
        await new Promise((resolve) => setTimeout(resolve, 500));
      } while (true);
      const chiefLog = compose(['logs', '--no-color', 'stratum-chief-0']);
      assert.equal(state, 'exited 0', `the chief: ${state}\n${chiefLog.slice(-3000)}`);
      const accuracy = Number(chiefLog.match(/test accuracy (\d\.\d+)/)?.[1]);
      assert.ok(accuracy >= MIN_ACCURACY, `test accuracy ${accuracy}:\n${chiefLog.slice(-2000)}`);
      console.log(`# compose: test accuracy ${accuracy}`);
      // The healthchecks (stratum-health in each container) find the servers healthy.
      for (const service of ['stratum-ps-0', 'stratum-ps-1', 'stratum-worker-0', 'stratum-worker-1', 'stratum-evaluator-0']) {
        const container = id(service);
        let health;
        for (const until = Date.now() + 60000; Date.now() < until;) {
          health = docker(['inspect', '--format', '{{.State.Health.Status}}', container]).stdout.trim();
          if (health === 'healthy') break;
          await new Promise((resolve) => setTimeout(resolve, 500));
        }
        assert.equal(health, 'healthy', `${service}'s healthcheck`);
      }
      const evaluatorLog = compose(['logs', '--no-color', 'stratum-evaluator-0']);
      assert.match(evaluatorLog, /evaluated the checkpoint at step \d+: val_loss/, `the evaluator evaluated no checkpoint:\n${evaluatorLog.slice(-2000)}`);
    } finally {
      childProcess.spawnSync('docker-compose', ['-p', project, '-f', path.join(SOURCE, 'deploy', 'compose.yaml'),
        'down', '--volumes', '--timeout', '5'], { encoding: 'utf8', timeout: 180000 });
    }
  });
