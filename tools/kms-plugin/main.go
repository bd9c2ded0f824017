// Command kms-plugin is a KMS v2 plugin for the tests: it serves
// k8s.io/kms's gRPC service on a Unix socket and encrypts with AES-256-GCM
// under a 32-byte key read from a file (the key's SHA-256 is its key ID).
// It stands for the key management service a user runs (Vault, a cloud
// KMS); kube-apiserver talks to it exactly as to those. Each call is
// logged, so a test can see that kube-apiserver used it.
package main

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/kms/pkg/service"
)

type plugin struct {
	aead  cipher.AEAD
	keyID string
}

func (p *plugin) Encrypt(_ context.Context, uid string, data []byte) (*service.EncryptResponse, error) {
	nonce := make([]byte, p.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	log.Printf("encrypt uid=%s bytes=%d", uid, len(data))
	return &service.EncryptResponse{
		Ciphertext: p.aead.Seal(nonce, nonce, data, nil),
		KeyID:      p.keyID,
	}, nil
}

func (p *plugin) Decrypt(_ context.Context, uid string, req *service.DecryptRequest) ([]byte, error) {
	if req.KeyID != p.keyID {
		return nil, fmt.Errorf("key ID %q is not this plugin's", req.KeyID)
	}
	n := p.aead.NonceSize()
	if len(req.Ciphertext) < n {
		return nil, errors.New("ciphertext too short")
	}
	log.Printf("decrypt uid=%s bytes=%d", uid, len(req.Ciphertext))
	return p.aead.Open(nil, req.Ciphertext[:n], req.Ciphertext[n:], nil)
}

func (p *plugin) Status(context.Context) (*service.StatusResponse, error) {
	return &service.StatusResponse{Version: "v2", Healthz: "ok", KeyID: p.keyID}, nil
}

func main() {
	listen := flag.String("listen", "/var/run/kmsplugin/socket.sock", "the Unix socket to serve on")
	keyFile := flag.String("key-file", "/etc/kms/key", "a file holding the 32-byte key (raw)")
	flag.Parse()
	key, err := os.ReadFile(*keyFile)
	if err != nil {
		log.Fatalf("reading the key: %v", err)
	}
	if len(key) != 32 {
		log.Fatalf("the key is %d bytes, not 32", len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		log.Fatal(err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		log.Fatal(err)
	}
	sum := sha256.Sum256(key)
	p := &plugin{aead: aead, keyID: hex.EncodeToString(sum[:8])}
	_ = os.Remove(*listen)
	s := service.NewGRPCService(*listen, 10*time.Second, p)
	go func() {
		stop := make(chan os.Signal, 1)
		signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
		<-stop
		s.Shutdown()
	}()
	log.Printf("serving KMS v2 on %s, key ID %s", *listen, p.keyID)
	if err := s.ListenAndServe(); err != nil {
		log.Fatal(err)
	}
}
