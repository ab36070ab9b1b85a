// Renders the Kubernetes manifests of deploy/k8s as kustomize would (the features they use;
// anything else is refused, so the manifests cannot drift past what the tests check), and
// lists the pods the rendered objects make, with the environment the kubelet gives each.
// Shared by k8s_manifests_test.js (offline checks) and container_test.js (the pods run as
// containers).
//
//   const k8s = require('./k8s_render')({ YAML, namespace });
'use strict';

const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');

module.exports = function k8sRender({ YAML, namespace }) {

  // ---------------------------------------------------------------------------------------
  // A renderer of the kustomize features the manifests use. Anything else is refused, so
  // the manifests cannot drift past what this test checks.

  const KUSTOMIZATION_KEYS = new Set(['apiVersion', 'kind', 'resources', 'components',
    'configMapGenerator', 'replicas', 'replacements', 'patches', 'images']);

  function readYamlDocuments(file) {
    return YAML.parseAllDocuments(fs.readFileSync(file, 'utf8')).map((doc) => {
      if (doc.errors.length) throw new Error(`${file}: ${doc.errors[0].message}`);
      return doc.toJS();
    }).filter((doc) => doc !== null);
  }

  function readKustomization(dir) {
    const file = path.join(dir, 'kustomization.yaml');
    const k = YAML.parse(fs.readFileSync(file, 'utf8'));
    for (const key of Object.keys(k)) {
      assert.ok(KUSTOMIZATION_KEYS.has(key), `${file}: "${key}" is not rendered by this test`);
    }
    return k;
  }

  function matches(object, target) {
    for (const key of Object.keys(target)) {
      assert.ok(['kind', 'name', 'group', 'version'].includes(key), `target key ${key} is not rendered`);
    }
    if (target.kind && object.kind !== target.kind) return false;
    if (target.name && object.metadata.name !== target.name) return false;
    return true;
  }

  function pointer(path_) {
    return path_.split('/').slice(1).map((part) => part.replace(/~1/g, '/').replace(/~0/g, '~'));
  }

  function applyJsonPatch(object, operations, where) {
    assert.ok(Array.isArray(operations), `${where}: only JSON 6902 patches (a list of ops) are rendered`);
    for (const op of operations) {
      const parts = pointer(op.path);
      const last = parts.pop();
      let parent = object;
      for (const part of parts) {
        parent = parent[part];
        assert.ok(parent !== undefined, `${where}: ${op.path} does not exist`);
      }
      if (op.op === 'add') {
        if (Array.isArray(parent)) parent.splice(last === '-' ? parent.length : Number(last), 0, op.value);
        else parent[last] = op.value;
      } else if (op.op === 'replace') {
        assert.ok(last in parent, `${where}: ${op.path} does not exist`);
        parent[last] = op.value;
      } else if (op.op === 'remove') {
        if (Array.isArray(parent)) parent.splice(Number(last), 1); else delete parent[last];
      } else {
        assert.fail(`${where}: op ${op.op} is not rendered`);
      }
    }
  }

  function getField(object, fieldPath) {
    return fieldPath.split('.').reduce((value, key) => (value === undefined ? undefined : value[key]), object);
  }

  function setField(object, fieldPath, value) {
    const keys = fieldPath.split('.');
    const last = keys.pop();
    const parent = keys.reduce((node, key) => node[key], object);
    assert.ok(parent && last in parent, `replacement target ${fieldPath} does not exist`);
    // kustomize keeps a string field a string.
    parent[last] = typeof parent[last] === 'string' ? String(value) : value;
  }

  function generateConfigMap(dir, generator) {
    const data = {};
    for (const literal of generator.literals || []) {
      const eq = literal.indexOf('=');
      data[literal.slice(0, eq)] = literal.slice(eq + 1);
    }
    for (const file of generator.files || []) data[path.basename(file)] = fs.readFileSync(path.join(dir, file), 'utf8');
    for (const key of Object.keys(generator)) {
      assert.ok(['name', 'literals', 'files', 'behavior'].includes(key), `configMapGenerator ${key} is not rendered`);
    }
    return { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: generator.name }, data };
  }

  // Renders the kustomization in `dir` (a Kustomization, or a Component applied to `input`).
  function render(dir, input = []) {
    const k = readKustomization(dir);
    let objects = [...input];
    for (const resource of k.resources || []) {
      const full = path.join(dir, resource);
      objects.push(...(fs.statSync(full).isDirectory() ? render(full) : readYamlDocuments(full)));
    }
    for (const component of k.components || []) {
      const full = path.join(dir, component);
      assert.equal(readKustomization(full).kind, 'Component', `${full} is not a Component`);
      objects = render(full, objects);
    }
    for (const generator of k.configMapGenerator || []) {
      const generated = generateConfigMap(dir, generator);
      const existing = objects.find((o) => o.kind === 'ConfigMap' && o.metadata.name === generator.name);
      if (generator.behavior === 'merge') {
        assert.ok(existing, `${dir}: configMapGenerator ${generator.name} merges into nothing`);
        Object.assign(existing.data, generated.data);
      } else {
        assert.ok(!existing, `${dir}: ConfigMap ${generator.name} is generated twice`);
        objects.push(generated);
      }
    }
    for (const patch of k.patches || []) {
      const operations = YAML.parse(patch.path ? fs.readFileSync(path.join(dir, patch.path), 'utf8') : patch.patch);
      const targets = objects.filter((o) => matches(o, patch.target));
      assert.ok(targets.length > 0, `${dir}: a patch targets nothing (${JSON.stringify(patch.target)})`);
      for (const target of targets) applyJsonPatch(target, structuredClone(operations), dir);
    }
    for (const image of k.images || []) {
      for (const object of objects) {
        for (const container of podSpec(object)?.containers || []) {
          const [name, tag] = container.image.split(':');
          if (name !== image.name) continue;
          container.image = `${image.newName || name}:${image.newTag || tag}`;
        }
      }
    }
    for (const { name, count } of k.replicas || []) {
      const targets = objects.filter((o) => o.metadata.name === name && o.spec && 'replicas' in o.spec);
      assert.equal(targets.length, 1, `${dir}: replicas names ${name}, which is not one workload`);
      targets[0].spec.replicas = count;
    }
    for (const replacement of k.replacements || []) {
      const source = objects.find((o) => matches(o, { kind: replacement.source.kind, name: replacement.source.name }));
      assert.ok(source, `${dir}: replacement source ${replacement.source.name} does not exist`);
      const value = getField(source, replacement.source.fieldPath);
      for (const target of replacement.targets) {
        const selected = objects.filter((o) => matches(o, target.select));
        assert.ok(selected.length > 0, `${dir}: a replacement selects nothing`);
        for (const object of selected) for (const field of target.fieldPaths) setField(object, field, value);
      }
    }
    return objects;
  }

  // ---------------------------------------------------------------------------------------
  // The cluster as the rendered manifests make it.

  function podSpec(object) {
    return object.spec && object.spec.template ? object.spec.template.spec : undefined;
  }

  function find(objects, kind, name) {
    const object = objects.find((o) => o.kind === kind && o.metadata.name === name);
    assert.ok(object, `no ${kind} ${name}`);
    return object;
  }

  function containerOf(object) {
    const containers = podSpec(object).containers;
    assert.equal(containers.length, 1, `${object.metadata.name} has one container`);
    return containers[0];
  }

  function configMapsOf(objects, container) {
    const data = {};
    for (const source of container.envFrom || []) {
      Object.assign(data, find(objects, 'ConfigMap', source.configMapRef.name).data);
    }
    return data;
  }

  // The environment of a pod's container, as the kubelet would set it: the ConfigMaps of
  // envFrom, then env in order, with the downward API's fields and $(VAR) references.
  function podEnvironment(objects, container, pod) {
    const env = configMapsOf(objects, container);
    const fields = {
      'metadata.name': pod.name,
      'metadata.namespace': namespace,
      "metadata.annotations['batch.kubernetes.io/job-completion-index']": String(pod.index),
    };
    for (const variable of container.env || []) {
      if ('value' in variable) {
        env[variable.name] = variable.value.replace(/\$\((\w+)\)/g,
          (whole, name) => (name in env ? env[name] : whole));
      } else {
        const field = variable.valueFrom.fieldRef.fieldPath;
        assert.ok(field in fields, `fieldRef ${field} is not rendered`);
        env[variable.name] = fields[field];
      }
    }
    return env;
  }

  // Every pod: its role, index, name, DNS name (what Kubernetes gives it) and workload. A
  // StatefulSet's pods are <name>-<i>; a Job's, the hostname it sets, or <name>-<i> for each
  // index of an Indexed Job (the hostname Kubernetes gives those).
  function podsOf(objects) {
    const pods = [];
    for (const object of objects) {
      const role = object.metadata.labels?.['app.kubernetes.io/component'];
      if (object.kind === 'StatefulSet') {
        for (let i = 0; i < object.spec.replicas; i++) {
          const name = `${object.metadata.name}-${i}`;
          pods.push({ role, index: i, name, dns: `${name}.${object.spec.serviceName}.${namespace}.svc`, object });
        }
      } else if (object.kind === 'Job' && object.spec.completionMode === 'Indexed') {
        const spec = podSpec(object);
        for (let i = 0; i < object.spec.completions; i++) {
          const name = `${object.metadata.name}-${i}`;
          pods.push({ role, index: i, name, dns: `${name}.${spec.subdomain}.${namespace}.svc`, object });
        }
      } else if (object.kind === 'Job') {
        const spec = podSpec(object);
        assert.equal(object.spec.parallelism ?? 1, 1, 'one coordinator pod');
        pods.push({ role, index: 0, name: spec.hostname, dns: `${spec.hostname}.${spec.subdomain}.${namespace}.svc`, object });
      }
    }
    return pods;
  }

  return { render, readYamlDocuments, podSpec, find, containerOf, configMapsOf, podEnvironment, podsOf };
};
