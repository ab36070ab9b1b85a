#!/usr/bin/env bash
# Makes the certificates of a Stratum cluster's mutual TLS with openssl: a CA of its own
# and one certificate, signed by it, that every task presents as server and as client.
#
#   deploy/make_tls_certs.sh DIR [NAME...]
#
# DIR gets ca.crt and ca.key (keep ca.key out of the cluster), tls.crt and tls.key. The
# certificate is for the DNS name "stratum" (what the manifests set as
# STRATUM_TLS_SERVER_NAME), localhost and 127.0.0.1, and each NAME given (a DNS name, or
# an IP address). Keys are ECDSA P-256; certificates last DAYS days (default 365).
# In Kubernetes:
#   kubectl create secret generic stratum-tls --from-file=DIR/tls.crt \
#     --from-file=DIR/tls.key --from-file=DIR/ca.crt
set -euo pipefail

if [ $# -lt 1 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
  sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  [ $# -lt 1 ] && exit 2 || exit 0
fi
command -v openssl >/dev/null || { echo "make_tls_certs.sh: openssl is missing: apt-get install openssl" >&2; exit 1; }
dir="$1"
shift
days="${DAYS:-365}"
mkdir -p "$dir"

san="DNS:stratum,DNS:localhost,IP:127.0.0.1"
for name in "$@"; do
  if [[ "$name" =~ ^[0-9.]+$ || "$name" == *:* ]]; then san+=",IP:$name"; else san+=",DNS:$name"; fi
done

key_args=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
openssl req -x509 "${key_args[@]}" -keyout "$dir/ca.key" -out "$dir/ca.crt" -days "$days" \
  -subj "/CN=Stratum cluster CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  2>/dev/null
openssl req "${key_args[@]}" -keyout "$dir/tls.key" -out "$dir/tls.csr" -subj "/CN=stratum" \
  2>/dev/null
extensions="$dir/tls.ext"
cat >"$extensions" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$san
EXT
openssl x509 -req -in "$dir/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
  -out "$dir/tls.crt" -days "$days" -extfile "$extensions" 2>/dev/null
rm -f "$dir/tls.csr" "$extensions" "$dir/ca.srl"
chmod 600 "$dir/ca.key" "$dir/tls.key"
echo "make_tls_certs.sh: wrote $dir/ca.crt, $dir/ca.key, $dir/tls.crt, $dir/tls.key ($san)"
