#include "common/net/curve_keys.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace tessera {
namespace {

constexpr size_t kZ85KeyChars = 40;

bool CurveAvailable() { return zmq_has("curve") != 0; }

Status NoCurve() {
  return Unimplemented("this libzmq was built without CURVE support (zmq_has(\"curve\") is false)");
}

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

// Writes `text` to a new file `path` with `mode`; fails if it exists.
Status WriteNew(const std::string& path, const std::string& text, mode_t mode) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) {
    if (errno == EEXIST)
      return FailedPrecondition(path + ": exists; remove it first (keys are never overwritten)");
    return IoError(path + ": cannot create: " + std::strerror(errno));
  }
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string why = std::strerror(errno);
      close(fd);
      return IoError(path + ": cannot write: " + why);
    }
    done += static_cast<size_t>(n);
  }
  // The umask may have narrowed the mode; never widen a secret's.
  fchmod(fd, mode);
  if (close(fd) != 0) return IoError(path + ": cannot write: " + std::strerror(errno));
  return Status::Ok();
}

}  // namespace

bool IsZ85Key(std::string_view key) {
  if (key.size() != kZ85KeyChars) return false;
  const std::string text(key);
  uint8_t bytes[32];
  return zmq_z85_decode(bytes, text.c_str()) != nullptr;
}

StatusOr<CurveKeyPair> GenerateCurveKeyPair() {
  if (!CurveAvailable()) return NoCurve();
  char pub[kZ85KeyChars + 1] = {};
  char sec[kZ85KeyChars + 1] = {};
  if (zmq_curve_keypair(pub, sec) != 0)
    return Internal(std::string("zmq_curve_keypair failed: ") + zmq_strerror(zmq_errno()));
  return CurveKeyPair{pub, sec};
}

StatusOr<std::string> CurvePublicKey(std::string_view secret_key) {
  if (!CurveAvailable()) return NoCurve();
  if (!IsZ85Key(secret_key)) return InvalidArgument("a CURVE secret key must be 40 Z85 characters");
  const std::string sec(secret_key);
  char pub[kZ85KeyChars + 1] = {};
  if (zmq_curve_public(pub, sec.c_str()) != 0)
    return InvalidArgument(std::string("not a CURVE secret key: ") + zmq_strerror(zmq_errno()));
  return std::string(pub);
}

StatusOr<CurveKeyPair> LoadCurveSecretKeyFile(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT)
      return NotFound(path + ": CURVE secret key file does not exist (tessera keygen makes one)");
    return IoError(path + ": cannot stat the CURVE secret key file: " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return IoError(path + ": the CURVE secret key is not a regular file");
  if (st.st_mode & (S_IRWXG | S_IRWXO))
    return FailedPrecondition(
        path + ": the CURVE secret key file is accessible by group or others (mode " +
        std::to_string((st.st_mode >> 6) & 7) + std::to_string((st.st_mode >> 3) & 7) +
        std::to_string(st.st_mode & 7) + "); chmod 600 it");
  std::ifstream in(path);
  if (!in)
    return IoError(path + ": cannot open the CURVE secret key file: " + std::strerror(errno));
  std::string line, key;
  int keys = 0;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    const std::string t = Trim(line);
    if (t.empty() || t[0] == '#') continue;
    ++keys;
    if (!IsZ85Key(t))
      return InvalidArgument(path + ":" + std::to_string(line_no) +
                             ": expected a 40-character Z85 CURVE secret key, got " +
                             std::to_string(t.size()) + " characters");
    key = t;
  }
  if (in.bad()) return IoError(path + ": cannot read the CURVE secret key file");
  if (keys != 1)
    return InvalidArgument(path + ": expected exactly one Z85 secret key line, found " +
                           std::to_string(keys));
  StatusOr<std::string> pub = CurvePublicKey(key);
  if (!pub.ok()) return pub.status().WithContext(path);
  return CurveKeyPair{*pub, key};
}

Status WriteCurveKeyPair(const CurveKeyPair& pair, const std::string& base) {
  if (!IsZ85Key(pair.public_key) || !IsZ85Key(pair.secret_key))
    return InvalidArgument("not a CURVE key pair (each half must be 40 Z85 characters)");
  TESSERA_RETURN_IF_ERROR(
      WriteNew(base + ".key",
               "# Tessera control-plane CURVE secret key. Keep it private (mode 0600).\n" +
                   pair.secret_key + "\n",
               0600));
  return WriteNew(base + ".pub",
                  "# Tessera control-plane CURVE public key (list it in the config).\n" +
                      pair.public_key + "\n",
                  0644);
}

std::vector<std::string> DeploymentKeys::CoordinatorOverrides() const {
  std::string list;
  for (const std::string& k : worker_public_keys) list += (list.empty() ? "\"" : ", \"") + k + "\"";
  return {"control.coordinator_secret_key_file=" + coordinator_secret_file,
          "control.worker_public_keys=[" + list + "]"};
}

std::vector<std::string> DeploymentKeys::WorkerOverrides(int i) const {
  return {"control.worker_secret_key_file=" + worker_secret_files.at(static_cast<size_t>(i)),
          "control.coordinator_public_key=" + coordinator_public_key};
}

StatusOr<DeploymentKeys> MakeDeploymentKeys(const std::string& dir, int workers) {
  DeploymentKeys out;
  TESSERA_ASSIGN_OR_RETURN(CurveKeyPair coordinator, GenerateCurveKeyPair());
  TESSERA_RETURN_IF_ERROR(WriteCurveKeyPair(coordinator, dir + "/coordinator"));
  out.coordinator_secret_file = dir + "/coordinator.key";
  out.coordinator_public_key = coordinator.public_key;
  for (int i = 0; i < workers; ++i) {
    TESSERA_ASSIGN_OR_RETURN(CurveKeyPair w, GenerateCurveKeyPair());
    const std::string base = dir + "/worker" + std::to_string(i);
    TESSERA_RETURN_IF_ERROR(WriteCurveKeyPair(w, base));
    out.worker_secret_files.push_back(base + ".key");
    out.worker_public_keys.push_back(w.public_key);
  }
  return out;
}

}  // namespace tessera
