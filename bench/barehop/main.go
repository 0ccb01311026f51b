// Command barehop is the benchmark's floor for a jump host: an x/crypto SSH
// server that accepts any public key, answers direct-tcpip channels by
// dialing the target and copying bytes both ways, and does nothing else (no
// authorization, routing, audit, limits or recordings). It exists only so
// bench/postern-vs-openssh.sh can measure what Postern's hop costs above the
// library it is built on, in the same run as the other arms (issue 17's
// "bare x/crypto hop" anchor). Never run it anywhere but loopback.
package main

import (
	"crypto/ed25519"
	"crypto/rand"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"

	"golang.org/x/crypto/ssh"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address (loopback)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile to FILE until SIGTERM or SIGINT (to compare with the proxy's pprof)")
	flag.Parse()
	// It forwards anything for anyone: refuse to listen beyond loopback.
	if host, _, err := net.SplitHostPort(*addr); err != nil || net.ParseIP(host) == nil || !net.ParseIP(host).IsLoopback() {
		log.Fatalf("barehop: -addr %q: want a loopback IP:port (it accepts any key and forwards anywhere)", *addr)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
		go func() {
			<-sig
			pprof.StopCPUProfile()
			f.Close()
			os.Exit(0)
		}()
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		log.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		log.Fatal(err)
	}
	cfg := &ssh.ServerConfig{
		PublicKeyCallback: func(ssh.ConnMetadata, ssh.PublicKey) (*ssh.Permissions, error) { return nil, nil },
	}
	cfg.AddHostKey(signer)
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Fprintln(os.Stdout, ln.Addr().String())
	for {
		c, err := ln.Accept()
		if err != nil {
			log.Fatal(err)
		}
		go serve(c, cfg)
	}
}

func serve(c net.Conn, cfg *ssh.ServerConfig) {
	sc, chans, reqs, err := ssh.NewServerConn(c, cfg)
	if err != nil {
		c.Close()
		return
	}
	defer sc.Close()
	go ssh.DiscardRequests(reqs)
	for nc := range chans {
		if nc.ChannelType() != "direct-tcpip" {
			nc.Reject(ssh.UnknownChannelType, "direct-tcpip only")
			continue
		}
		var req struct {
			Host       string
			Port       uint32
			OriginHost string
			OriginPort uint32
		}
		if err := ssh.Unmarshal(nc.ExtraData(), &req); err != nil {
			nc.Reject(ssh.ConnectionFailed, "bad request")
			continue
		}
		go forward(nc, net.JoinHostPort(req.Host, fmt.Sprint(req.Port)))
	}
}

func forward(nc ssh.NewChannel, target string) {
	tc, err := net.Dial("tcp", target)
	if err != nil {
		nc.Reject(ssh.ConnectionFailed, err.Error())
		return
	}
	ch, reqs, err := nc.Accept()
	if err != nil {
		tc.Close()
		return
	}
	go ssh.DiscardRequests(reqs)
	done := make(chan struct{}, 2)
	go func() { io.Copy(ch, tc); ch.CloseWrite(); done <- struct{}{} }()
	go func() { io.Copy(tc, ch); tc.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
	<-done
	<-done
	ch.Close()
	tc.Close()
}
