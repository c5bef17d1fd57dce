# Sums `perf report --no-children --sort dso,sym -g none -q` lines by kind of work, percent of
# the samples read: the kinds scripts/profile-h3.sh and scripts/profile-scale.sh print.
    { pct = $1; sub("%", "", pct); dso = $2; sym = ""; for (i = 4; i <= NF; i++) sym = sym " " $i
      c = "other"
      if (sym ~ /__napi_schedule|irqentry_exit|finish_task_switch|__pv_queued_spin|_raw_spin_unlock_irqrestore|handle_softirqs/) c = "waking the peer, interrupts, locks (kernel)"
      else if (sym ~ /aes|gcm|ghash|gmult|chacha|poly1305|EVP_|aead/ || dso ~ /libcrypto/) c = "crypto (AES-GCM)"
      else if (sym ~ /memmove|memcpy|memset|copy_user|_copy_from_iter|_copy_to_iter|__check_object_size/) c = "copies"
      else if (sym ~ /malloc|free|_int_|realloc|kmem_cache|kmalloc|kfree|__alloc|alloc_skb|skb_release|__slab|slab_/) c = "allocation (user and kernel)"
      else if (dso ~ /kernel/ && sym ~ /tcp_|inet_|ip_|skb_|udp|dev_|netif|napi|gro|gso|veth|nf_|sock_|lock_sock|release_sock|fib_|neigh|net_rx|csum/) c = "network stack (kernel)"
      else if (dso ~ /kernel/) c = "system calls, scheduling, other (kernel)"
      else if (sym ~ /quiche|octets|qpack/) c = "quiche"
      else if (sym ~ /udpx/) c = "udpx (host, file server)"
      else if (dso ~ /nginx|libssl/) c = "nginx, OpenSSL (not crypto)"
      s[c] += pct; t += pct }
    END { for (c in s) printf "%6.1f %%  %s\n", s[c] * 100 / t, c }
