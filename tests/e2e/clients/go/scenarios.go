// Scenarios run with amqp091-go (Debian's golang-github-rabbitmq-amqp091-go-dev, 1.5.0) against a
// broker given by URL. Usage: scenarios URL SCENARIO QUEUE_PREFIX. Prints one JSON object: what
// the client saw. tests/e2e/test_go_client.py builds this file (GOPATH mode, against the Debian
// sources, offline), runs each scenario against Leveret and against the reference RabbitMQ, and
// asserts the same output on both.
package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

const patience = 10 * time.Second

type result map[string]interface{}

// The methods the client reads off the socket, in order, named as the scenarios name them.
var watched = map[[2]uint16]string{
	{60, 30}: "cancelled", // basic.cancel
	{60, 60}: "message",   // basic.deliver
	{50, 41}: "delete-ok", // queue.delete-ok
}

// frameLog splits what the client reads into frames and notes the watched methods.
type frameLog struct {
	mu        sync.Mutex
	pending   []byte
	recording bool
	seen      []string
}

var wire = &frameLog{}

func (l *frameLog) feed(data []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending = append(l.pending, data...)
	for len(l.pending) >= 7 {
		size := int(binary.BigEndian.Uint32(l.pending[3:7]))
		if len(l.pending) < 7+size+1 {
			return
		}
		payload := l.pending[7 : 7+size]
		if l.recording && l.pending[0] == 1 && size >= 4 {
			id := [2]uint16{binary.BigEndian.Uint16(payload[0:2]), binary.BigEndian.Uint16(payload[2:4])}
			if name, ok := watched[id]; ok {
				l.seen = append(l.seen, name)
			}
		}
		l.pending = l.pending[7+size+1:]
	}
}

func (l *frameLog) start() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recording = true
}

func (l *frameLog) events() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string{}, l.seen...)
}

type loggedConn struct {
	net.Conn
	log *frameLog
}

func (c loggedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.log.feed(p[:n])
	return n, err
}

func dial(network, addr string) (net.Conn, error) {
	conn, err := net.DialTimeout(network, addr, patience)
	if err != nil {
		return nil, err
	}
	return loggedConn{conn, wire}, nil
}

func failure(err error) interface{} {
	if err == nil {
		return nil
	}
	var amqpErr *amqp.Error
	if errors.As(err, &amqpErr) {
		return result{"code": amqpErr.Code, "text": amqpErr.Reason, "server": amqpErr.Server}
	}
	return result{"code": nil, "text": err.Error(), "server": false}
}

// Publish with confirms, consume with a prefetch, ack: the everyday path.
func basics(conn *amqp.Connection, prefix string) (result, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	q := prefix + "-basics"
	if err := ch.Confirm(false); err != nil {
		return nil, err
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 5))
	// amqp091-go sends on this channel from its reader goroutine: it must have room.
	cancels := ch.NotifyCancel(make(chan string, 1))
	if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
		return nil, err
	}
	for i := 0; i < 5; i++ {
		msg := amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte(fmt.Sprintf("m%d", i))}
		if err := ch.Publish("", q, false, false, msg); err != nil {
			return nil, err
		}
	}
	for i := 0; i < 5; i++ { // the "OrDie" of waitForConfirmsOrDie: every one acked, in time
		select {
		case c := <-confirms:
			if !c.Ack {
				return nil, fmt.Errorf("publish %d was nacked", c.DeliveryTag)
			}
		case <-time.After(patience):
			return nil, fmt.Errorf("%d of 5 confirms arrived", i)
		}
	}
	if err := ch.Qos(2, 0, false); err != nil {
		return nil, err
	}
	deliveries, err := ch.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		return nil, err
	}
	got := []string{}
	for len(got) < 5 {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return nil, fmt.Errorf("deliveries closed after %v", got)
			}
			got = append(got, string(d.Body))
			if err := d.Ack(false); err != nil {
				return nil, err
			}
		case <-time.After(patience):
			return nil, fmt.Errorf("only %v arrived", got)
		}
	}
	if _, err := ch.QueueDelete(q, false, false, false); err != nil {
		return nil, err
	}
	time.Sleep(300 * time.Millisecond)
	if len(cancels) > 0 {
		got = append(got, "cancelled")
	}
	return result{"received": got}, nil
}

// connection.update-secret mid-stream: the consumer keeps receiving.
func updateSecret(conn *amqp.Connection, prefix string) (result, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	q := prefix + "-secret"
	if err := ch.Confirm(false); err != nil {
		return nil, err
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 2))
	if _, err := ch.QueueDeclare(q, false, false, false, false, nil); err != nil {
		return nil, err
	}
	deliveries, err := ch.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		return nil, err
	}
	got := []string{}
	publish := func(body string) error {
		if err := ch.Publish("", q, false, false, amqp.Publishing{Body: []byte(body)}); err != nil {
			return err
		}
		select {
		case c := <-confirms:
			if !c.Ack {
				return fmt.Errorf("%s was nacked", body)
			}
		case <-time.After(patience):
			return fmt.Errorf("no confirm for %s", body)
		}
		select {
		case d, ok := <-deliveries:
			if !ok {
				return fmt.Errorf("deliveries closed before %s", body)
			}
			got = append(got, string(d.Body))
			return d.Ack(false)
		case <-time.After(patience):
			return fmt.Errorf("%s was not delivered", body)
		}
	}
	if err := publish("before"); err != nil {
		return nil, err
	}
	if err := conn.UpdateSecret("guest", "token refresh"); err != nil {
		return result{"received": got, "update_secret": failure(err)}, nil
	}
	if err := publish("after"); err != nil {
		return nil, err
	}
	if _, err := ch.QueueDelete(q, false, false, false); err != nil {
		return nil, err
	}
	return result{"received": got, "update_secret": nil}, nil
}

// A second exclusive consumer from another channel of the same connection.
func exclusiveOtherChannel(conn *amqp.Connection, prefix string) (result, error) {
	q := prefix + "-excl"
	ch1, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if _, err := ch1.QueueDeclare(q, false, false, false, false, nil); err != nil {
		return nil, err
	}
	if _, err := ch1.Consume(q, "", false, true, false, false, nil); err != nil {
		return nil, err
	}
	ch2, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	closed := ch2.NotifyClose(make(chan *amqp.Error, 1))
	_, refused := ch2.Consume(q, "", false, true, false, false, nil)
	time.Sleep(300 * time.Millisecond) // anything the broker sends after its answer arrives too
	var closedWith interface{}
	select {
	case reason, ok := <-closed:
		if ok && reason != nil {
			closedWith = failure(reason)
		}
	default:
	}
	out := result{
		"error":                failure(refused),
		"channel2_closed_with": closedWith,
		"channel1_open":        !ch1.IsClosed(),
		"channel2_open":        !ch2.IsClosed(),
		"connection_open":      !conn.IsClosed(),
	}
	if !ch1.IsClosed() {
		if _, err := ch1.QueueDelete(q, false, false, false); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// The consuming channel deletes its own queue: is the consumer told (NotifyCancel), and before
// or after delete-ok? amqp091-go reads frames on one goroutine, but it hands basic.cancel to
// NotifyCancel and delete-ok to QueueDelete's caller over channels, so which of the two this
// goroutine notices first is a race. The order is taken where the client reads the frames: the
// connection it reads from (Config.Dial) notes each method it passes on. The client's own API
// must see the same two events: the cancel through NotifyCancel, the count through QueueDelete.
func deleteUnderConsumer(conn *amqp.Connection, prefix string) (result, error) {
	q := prefix + "-del"
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	cancels := ch.NotifyCancel(make(chan string, 1))
	if _, err := ch.QueueDeclare(q, false, false, false, false, nil); err != nil {
		return nil, err
	}
	tag := prefix + "-consumer"
	if _, err := ch.Consume(q, tag, false, false, false, false, nil); err != nil {
		return nil, err
	}
	wire.start()
	count, err := ch.QueueDelete(q, false, false, false)
	if err != nil {
		return nil, err
	}
	notified := false
	select {
	case cancelled := <-cancels:
		notified = cancelled == tag
	case <-time.After(300 * time.Millisecond):
	}
	time.Sleep(300 * time.Millisecond) // a cancel that comes after delete-ok is read too
	return result{"events": wire.events(), "cancel_notified": notified, "message_count": count}, nil
}

func main() {
	url, scenario, prefix := os.Args[1], os.Args[2], os.Args[3]
	scenarios := map[string]func(*amqp.Connection, string) (result, error){
		"basics":                  basics,
		"update_secret":           updateSecret,
		"exclusive_other_channel": exclusiveOtherChannel,
		"delete_under_consumer":   deleteUnderConsumer,
	}
	run, known := scenarios[scenario]
	var out result
	var err error
	if !known {
		err = fmt.Errorf("unknown scenario %s", scenario)
	} else {
		var conn *amqp.Connection
		conn, err = amqp.DialConfig(url, amqp.Config{Dial: dial})
		if err == nil {
			out, err = run(conn, prefix)
			conn.Close()
		}
	}
	status := 0
	if err != nil {
		out = result{"crashed": failure(err)}
		status = 1
	}
	encoded, _ := json.Marshal(out)
	fmt.Println(string(encoded))
	os.Exit(status)
}
