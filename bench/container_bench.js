// The container image's figures, as JSON lines (no goals: issue 37 asks for the figures):
// its size (and, with --build, the time of a build from nothing but the base image), the
// start-up of the parameter-server job's 5 containers until every readiness probe answers
// SERVING, and that job's test accuracy and examples/s in containers against the same job
// as bare processes (stratum-launch), run one after the other, alternating, --runs times.
//
//   node bench/container_bench.js --source . --node-modules build/node/node_modules \
//        --bin build/bin [--runs 2] [--build]
// Needs a Docker engine, the image (deploy/docker/build.sh) and the npm packages of
// tests/deploy/install_node_packages.sh.
'use strict';

const childProcess = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { createRequire } = require('node:module');

function option(name, fallback) {
  const index = process.argv.indexOf(name);
  if (index < 0) {
    if (fallback !== undefined) return fallback;
    console.error(`container_bench.js: missing ${name}`);
    process.exit(2);
  }
  return process.argv[index + 1];
}

const SOURCE = path.resolve(option('--source'));
const NODE_MODULES = path.resolve(option('--node-modules'));
const BIN = path.resolve(option('--bin'));
const RUNS = Number(option('--runs', '2'));
const BUILD = process.argv.includes('--build');
const TESTS = path.join(SOURCE, 'tests', 'deploy');
const { ContainerCluster, docker, engineProblem } = require(path.join(TESTS, 'container_cluster'));
const YAML = createRequire(path.join(NODE_MODULES, '..', 'package.json'))('yaml');
const k8s = require(path.join(TESTS, 'k8s_render'))({ YAML, namespace: 'stratum-bench' });

const PODS = ['stratum-ps-0', 'stratum-ps-1', 'stratum-worker-0', 'stratum-worker-1', 'stratum-chief-0'];

function emit(benchmark, value, unit, setup) {
  console.log(JSON.stringify({ benchmark, goal: null, setup, unit, value }));
}

const median = (values) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)];

async function containerRun(run) {
  const objects = k8s.render(path.join(SOURCE, 'deploy', 'k8s', 'overlays', 'cpu'));
  const cluster = new ContainerCluster(k8s, objects, { label: `bench${run}` });
  try {
    const start = Date.now();
    for (const name of PODS) cluster.start(name);
    await cluster.waitUntilServing(PODS, 120000);
    const startupMs = Date.now() - start;
    const code = await cluster.waitForExit('stratum-chief-0', 600000);
    if (code !== 0) throw new Error(`the chief exited with ${code}:\n${cluster.logs('stratum-chief-0')}`);
    const summary = JSON.parse(cluster.readVolumeFile('stratum-checkpoints', 'summary.json'));
    const peak = (names) => Math.max(...names.map((n) => cluster.peakMemoryBytes(n) ?? NaN)) / 2 ** 20;
    return { startupMs, summary, psMib: peak(['stratum-ps-0', 'stratum-ps-1']),
             workerMib: peak(['stratum-worker-0', 'stratum-worker-1']) };
  } finally {
    cluster.cleanup();
  }
}

function bareRun() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'stratum-bench-bare-'));
  try {
    // The manifests' job, checkpointing into a folder of this run.
    const job = JSON.parse(fs.readFileSync(path.join(SOURCE, 'deploy', 'k8s', 'base', 'job.json'), 'utf8'));
    job.checkpoint.dir = path.join(dir, 'ckpt');
    fs.writeFileSync(path.join(dir, 'job.json'), JSON.stringify(job));
    const summaryPath = path.join(dir, 'summary.json');
    const run = childProcess.spawnSync(path.join(BIN, 'stratum-launch'),
      ['--job', path.join(dir, 'job.json'), '--summary_json', summaryPath, '--log_dir', path.join(dir, 'logs')],
      { encoding: 'utf8', timeout: 600000 });
    if (run.status !== 0) throw new Error(`stratum-launch failed (${run.status}): ${run.stdout}${run.stderr}`);
    return JSON.parse(fs.readFileSync(summaryPath, 'utf8'));
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

async function main() {
  const problem = engineProblem();
  if (problem) {
    console.error(`container_bench.js: ${problem}`);
    process.exit(1);
  }
  const image = k8s.containerOf(k8s.podsOf(k8s.render(path.join(SOURCE, 'deploy', 'k8s', 'overlays', 'cpu')))[0].object).image;
  if (BUILD) {
    const start = Date.now();
    const build = childProcess.spawnSync('bash', [path.join(SOURCE, 'deploy', 'docker', 'build.sh'), '--no-cache'],
      { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] });
    if (build.status !== 0) process.exit(1);
    emit('container_image_build_s', (Date.now() - start) / 1000, 's',
      `deploy/docker/build.sh --no-cache (base image present: compile in the build stage, runtime packages), ${os.cpus().length} cores`);
  }
  const size = Number(docker(['image', 'inspect', '--format', '{{.Size}}', image]).stdout.trim());
  emit('container_image_mib', size / 2 ** 20, 'MiB', `${image}, as docker image inspect reports it`);

  const startups = [];
  const memory = { ps: [], worker: [] };
  const containers = [];
  const bare = [];
  for (let run = 0; run < RUNS; run++) {
    const result = await containerRun(run);
    startups.push(result.startupMs);
    memory.ps.push(result.psMib);
    memory.worker.push(result.workerMib);
    containers.push(result.summary);
    bare.push(bareRun());
  }
  const setup = `the PS job of deploy/k8s (Fashion-MNIST, Dense 128, 2 workers, 2 ps, 10 epochs), medians of ${RUNS} runs alternating, ${os.cpus().length} cores`;
  emit('container_cluster_startup_to_serving_ms', median(startups), 'ms',
    '5 containers of overlays/cpu, from the first docker run until every readiness probe (grpc.health.v1 from a container on the network) answers SERVING');
  const memorySetup = `the most memory a container's cgroup used (page cache included, what a pod's limit counts), the larger of the two, median of ${RUNS} runs; the manifests request 2Gi`;
  emit('container_peak_memory_mib_ps', median(memory.ps), 'MiB', memorySetup);
  emit('container_peak_memory_mib_worker', median(memory.worker), 'MiB', memorySetup);
  const accuracy = (s) => median(s.map((x) => x.test_accuracy));
  const speed = (s) => median(s.map((x) => x.examples_per_sec));
  emit('ps_job_test_accuracy_containers', accuracy(containers), 'accuracy', setup);
  emit('ps_job_test_accuracy_bare', accuracy(bare), 'accuracy', setup);
  emit('ps_job_examples_per_s_containers', speed(containers), 'examples/s', setup);
  emit('ps_job_examples_per_s_bare', speed(bare), 'examples/s', setup);
  emit('ps_job_containers_over_bare', speed(containers) / speed(bare), 'x', setup);
}

main().catch((error) => {
  console.error(`container_bench.js: ${error.stack || error}`);
  process.exit(1);
});
