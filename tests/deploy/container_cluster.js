// The pods of the rendered Kubernetes manifests, run as Docker containers on one Docker
// network: each container gets what the manifests give its pod (hostname, the headless
// Service's DNS names as network aliases, the environment with the downward API's fields,
// command and args, user and groups, read-only root, dropped capabilities, memory limit,
// grace period, and its volumes: emptyDir as tmpfs, ConfigMaps and Secrets as read-only
// files, a claim as a Docker volume that every pod mounting it shares). A prober container
// on the network runs the pods' gRPC probes against their IPs, as the kubelet would.
// Used by container_test.js and bench/container_bench.js.
'use strict';

const assert = require('node:assert/strict');
const childProcess = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

function docker(args, { timeout = 120000, check = true } = {}) {
  const run = childProcess.spawnSync('docker', args, { encoding: 'utf8', timeout, maxBuffer: 64 << 20 });
  if (run.error) throw new Error(`docker ${args.slice(0, 2).join(' ')}: ${run.error.message}`);
  if (check && run.status !== 0) {
    throw new Error(`docker ${args.slice(0, 2).join(' ')} failed (exit ${run.status}): ${run.stderr.trim()}`);
  }
  return run;
}

// Null when a Docker engine answers, else why not.
function engineProblem() {
  const run = childProcess.spawnSync('docker', ['info', '--format', '{{.ServerVersion}}'],
    { encoding: 'utf8', timeout: 30000 });
  if (run.error) return `the docker client cannot run (${run.error.code})`;
  if (run.status !== 0) return `no Docker engine answers (${run.stderr.trim().split('\n').pop()})`;
  return null;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// "4Gi" -> bytes, as Docker's --memory takes them.
function quantityBytes(quantity) {
  const match = /^(\d+)(Ki|Mi|Gi|Ti|k|M|G|T)?$/.exec(String(quantity));
  assert.ok(match, `resource quantity ${quantity} is not rendered`);
  const scale = { Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, k: 1e3, M: 1e6, G: 1e9, T: 1e12 };
  return String(Number(match[1]) * (scale[match[2]] ?? 1));
}

class ContainerCluster {
  // `k8s`: the renderer of k8s_render.js; `objects`: a rendering; `secrets`: the files of
  // each Secret by name (Kubernetes would hold them); `label`: names this cluster's
  // containers, network and volumes (with the process id, so runs side by side never meet).
  constructor(k8s, objects, { label, secrets = {} }) {
    this.k8s = k8s;
    this.objects = objects;
    this.secrets = secrets;
    this.id = `stratum-ct-${process.pid}-${label}`;
    this.pods = k8s.podsOf(objects);
    this.dir = fs.mkdtempSync(path.join(os.tmpdir(), 'stratum-containers-'));
    fs.chmodSync(this.dir, 0o755);
    this.volumes = new Set();
    docker(['network', 'create', '--label', `stratum-test=${this.id}`, this.id]);
    this.image = k8s.containerOf(this.pods[0].object).image;
    // The kubelet's stand-in: probes come from outside the pods, over the pod network.
    this.prober = `${this.id}-prober`;
    docker(['run', '-d', '--name', this.prober, '--label', `stratum-test=${this.id}`, '--network', this.id,
      '--entrypoint', 'sleep', this.image, 'infinity']);
  }

  pod(name) {
    const pod = this.pods.find((p) => p.name === name);
    assert.ok(pod, `no pod ${name} in the manifests (${this.pods.map((p) => p.name).join(', ')})`);
    return pod;
  }

  container(name) {
    return `${this.id}-${name}`;
  }

  // A folder of files (a ConfigMap's or a Secret's), as the kubelet projects them.
  files(name, data, mode, gid) {
    const dir = path.join(this.dir, name);
    fs.mkdirSync(dir, { mode: 0o755 });
    for (const [file, content] of Object.entries(data)) {
      const full = path.join(dir, file);
      fs.writeFileSync(full, content);
      fs.chmodSync(full, mode);
      if (process.getuid() === 0) fs.chownSync(full, 0, gid);
    }
    return dir;
  }

  volumeArgs(pod) {
    const spec = this.k8s.podSpec(pod.object);
    const args = [];
    for (const mount of this.k8s.containerOf(pod.object).volumeMounts || []) {
      const volume = spec.volumes.find((v) => v.name === mount.name);
      assert.ok(volume, `${pod.name}: volumeMount ${mount.name} has no volume`);
      const readonly = mount.readOnly ? ',readonly' : '';
      if (volume.emptyDir) {
        args.push('--tmpfs', `${mount.mountPath}:rw,mode=1777`);
      } else if (volume.persistentVolumeClaim) {
        const name = `${this.id}-${volume.persistentVolumeClaim.claimName}`;
        if (!this.volumes.has(name)) {
          docker(['volume', 'create', '--label', `stratum-test=${this.id}`, name]);
          this.volumes.add(name);
        }
        args.push('--mount', `type=volume,src=${name},dst=${mount.mountPath}${readonly}`);
      } else if (volume.configMap) {
        const { data } = this.k8s.find(this.objects, 'ConfigMap', volume.configMap.name);
        const dir = this.files(`configmap-${pod.name}-${volume.name}`, data, 0o644, 0);
        args.push('--mount', `type=bind,src=${dir},dst=${mount.mountPath},readonly`);
      } else if (volume.secret) {
        const data = this.secrets[volume.secret.secretName];
        assert.ok(data, `${pod.name}: no Secret ${volume.secret.secretName} was given`);
        const dir = this.files(`secret-${pod.name}-${volume.name}-${Date.now()}`, data,
          volume.secret.defaultMode ?? 0o644, spec.securityContext?.fsGroup ?? 0);
        args.push('--mount', `type=bind,src=${dir},dst=${mount.mountPath},readonly`);
      } else {
        assert.fail(`${pod.name}: volume ${volume.name} is of a kind this test does not run`);
      }
    }
    return args;
  }

  // `docker run` of the pod as its manifest describes it.
  runArgs(pod) {
    const spec = this.k8s.podSpec(pod.object);
    const container = this.k8s.containerOf(pod.object);
    const podSecurity = spec.securityContext || {};
    const security = container.securityContext || {};
    const service = pod.dns.split('.').slice(0, 2).join('.');
    const args = ['run', '-d', '--name', this.container(pod.name), '--label', `stratum-test=${this.id}`,
      '--network', this.id, '--hostname', pod.name, '--network-alias', pod.dns, '--network-alias', service];
    for (const [key, value] of Object.entries(this.k8s.podEnvironment(this.objects, container, pod))) {
      args.push('-e', `${key}=${value}`);
    }
    if (podSecurity.runAsUser !== undefined) {
      args.push('--user', `${podSecurity.runAsUser}:${podSecurity.runAsGroup ?? podSecurity.runAsUser}`);
    }
    if (podSecurity.fsGroup !== undefined) args.push('--group-add', String(podSecurity.fsGroup));
    if (security.readOnlyRootFilesystem) args.push('--read-only');
    for (const capability of security.capabilities?.drop || []) args.push('--cap-drop', capability);
    if (security.allowPrivilegeEscalation === false) args.push('--security-opt', 'no-new-privileges');
    const memory = container.resources?.limits?.memory;
    if (memory) args.push('--memory', quantityBytes(memory));
    args.push('--stop-timeout', String(spec.terminationGracePeriodSeconds ?? 30));
    args.push(...this.volumeArgs(pod));
    args.push('--entrypoint', container.command[0], container.image, ...container.command.slice(1),
      ...(container.args || []));
    return args;
  }

  start(name) {
    docker(this.runArgs(this.pod(name)));
  }

  startAll() {
    for (const pod of this.pods) this.start(pod.name);
  }

  // What the kubelet does when a pod's container dies: start it again, same pod.
  restart(name) {
    docker(['start', this.container(name)]);
  }

  kill(name) {
    docker(['kill', this.container(name)]);
  }

  // `docker stop` of the given pods at once: SIGTERM, then SIGKILL after each pod's grace period.
  stop(names) {
    docker(['stop', ...names.map((n) => this.container(n))], { timeout: 180000 });
  }

  remove(name) {
    docker(['rm', '-f', this.container(name)]);
  }

  logs(name) {
    const run = docker(['logs', this.container(name)], { check: false });
    return run.stdout + run.stderr;
  }

  state(name) {
    const run = docker(['inspect', '--format', '{{.State.Status}} {{.State.ExitCode}}', this.container(name)]);
    const [status, code] = run.stdout.trim().split(' ');
    return { status, exitCode: Number(code) };
  }

  async waitForLog(name, pattern, timeoutMs) {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const text = this.logs(name);
      const match = text.match(pattern);
      if (match) return match;
      const { status } = this.state(name);
      if (status === 'exited') assert.fail(`${name} exited before logging ${pattern}:\n${text.slice(-3000)}`);
      if (Date.now() > deadline) assert.fail(`${name} did not log ${pattern} in ${timeoutMs} ms:\n${text.slice(-3000)}`);
      await sleep(200);
    }
  }

  async waitForExit(name, timeoutMs) {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const state = this.state(name);
      if (state.status === 'exited') return state.exitCode;
      if (Date.now() > deadline) assert.fail(`${name} still runs after ${timeoutMs} ms:\n${this.logs(name).slice(-3000)}`);
      await sleep(250);
    }
  }

  // The most memory the container's cgroup has used (what a pod's memory limit counts), in
  // bytes; null where the cgroup cannot be read (an exited container has none).
  peakMemoryBytes(name) {
    const id = docker(['inspect', '--format', '{{.Id}}', this.container(name)]).stdout.trim();
    for (const file of [`/sys/fs/cgroup/memory/docker/${id}/memory.max_usage_in_bytes`,
      `/sys/fs/cgroup/system.slice/docker-${id}.scope/memory.peak`]) {
      try {
        return Number(fs.readFileSync(file, 'utf8').trim());
      } catch {
        // the other cgroup layout
      }
    }
    return null;
  }

  ip(name) {
    return docker(['inspect', '--format', '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}',
      this.container(name)]).stdout.trim();
  }

  // The pod's readinessProbe, as the kubelet runs a gRPC probe: a grpc.health.v1 Check of the
  // pod's IP at the probe's port, from outside the pod. Null when SERVING, else the reason.
  probe(name) {
    const probe = this.k8s.containerOf(this.pod(name).object).readinessProbe;
    assert.ok(probe?.grpc, `${name} declares no gRPC readiness probe`);
    const run = docker(['exec', this.prober, 'stratum-health', `--address=${this.ip(name)}:${probe.grpc.port}`,
      `--timeout=${probe.timeoutSeconds ?? 1}s`], { check: false });
    return run.status === 0 ? null : (run.stderr.trim() || `exit ${run.status}`);
  }

  // Probes every pod until all are SERVING; the milliseconds that took.
  async waitUntilServing(names, timeoutMs) {
    const start = Date.now();
    const waiting = new Set(names);
    const reasons = {};
    while (waiting.size) {
      for (const name of [...waiting]) {
        const problem = this.probe(name);
        if (problem === null) waiting.delete(name); else reasons[name] = problem;
      }
      if (waiting.size && Date.now() - start > timeoutMs) {
        assert.fail(`not SERVING after ${timeoutMs} ms: ${[...waiting].map((n) => `${n} (${reasons[n]})`).join(', ')}`);
      }
      if (waiting.size) await sleep(100);
    }
    return Date.now() - start;
  }

  // Runs a command in a throwaway container of the image on the cluster's network (a
  // client next to the pods), with extra `docker run` arguments.
  runClient(extraArgs, command) {
    return docker(['run', '--rm', '--network', this.id, ...extraArgs, '--entrypoint', command[0],
      this.image, ...command.slice(1)], { check: false });
  }

  // A file on a claim's volume (e.g. the chief's summary.json), read through a container.
  readVolumeFile(claimName, file) {
    const run = docker(['run', '--rm', '--mount', `type=volume,src=${this.id}-${claimName},dst=/volume,readonly`,
      '--entrypoint', 'cat', this.image, `/volume/${file}`], { check: false });
    return run.status === 0 ? run.stdout : null;
  }

  listVolume(claimName, folder) {
    const run = docker(['run', '--rm', '--mount', `type=volume,src=${this.id}-${claimName},dst=/volume,readonly`,
      '--entrypoint', 'ls', this.image, `/volume/${folder}`], { check: false });
    return run.status === 0 ? run.stdout.split('\n').filter(Boolean) : [];
  }

  // Everything this cluster made, whatever state it is in.
  cleanup() {
    const label = `label=stratum-test=${this.id}`;
    const ids = docker(['ps', '-aq', '--filter', label], { check: false }).stdout.split('\n').filter(Boolean);
    if (ids.length) docker(['rm', '-f', ...ids], { check: false });
    docker(['network', 'rm', this.id], { check: false });
    for (const volume of this.volumes) docker(['volume', 'rm', '-f', volume], { check: false });
    fs.rmSync(this.dir, { recursive: true, force: true });
  }
}

module.exports = { ContainerCluster, docker, engineProblem, sleep };
