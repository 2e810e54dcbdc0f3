// What the JetStream publisher and mirror share of nats.c: error text, owners of its objects.
#pragma once

#include <nats/nats.h>

#include <string>

namespace walgate::proxy::nats_util {

inline std::string nats_error(natsStatus s, jsErrCode jerr = static_cast<jsErrCode>(0)) {
  std::string out = natsStatus_GetText(s);
  if (const char* last = nats_GetLastError(nullptr); last && *last && out.find(last) == std::string::npos) out += std::string(": ") + last;
  if (jerr) out += " (JetStream error " + std::to_string(static_cast<int>(jerr)) + ")";
  return out;
}

struct nats_options_ptr {
  natsOptions* p = nullptr;
  ~nats_options_ptr() { if (p) natsOptions_Destroy(p); }
};
struct stream_info_ptr {
  jsStreamInfo* p = nullptr;
  ~stream_info_ptr() { if (p) jsStreamInfo_Destroy(p); }
};
struct msg_ptr {
  natsMsg* p = nullptr;
  ~msg_ptr() { if (p) natsMsg_Destroy(p); }
};

}  // namespace walgate::proxy::nats_util
